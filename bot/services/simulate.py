"""A rules simulation: the requests and lease lives recorded in a window, replayed through a
candidate policy next to the policy in force (`rules.simulate`), printed as a summary and one
line (or JSON object) per difference, and its summary kept per candidate revision so that
`/gpu admin reload` can say what loading that revision would change."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from bot.services.overview import BUSY_PCT
from rules.engine.reference import ReferenceEngine
from rules.errors import FactError
from rules.minute_trace import GpuTrace
from rules.policy import Policy
from rules.simulate import (
    LeaseChange,
    RequestChange,
    RequestDecisions,
    Summary,
    lease_changes,
    summarise,
)
from rules.sweep_replay import STEP, SweepReplay
from storage import keyvalue, replay
from storage.db import Database
from storage.replay import Asked


@dataclass(frozen=True)
class Simulation:
    """What the candidate would have changed over [since, until)."""

    in_force: str  # revisions
    candidate: str
    since: datetime
    until: datetime
    summary: Summary
    requests: tuple[RequestChange, ...]
    leases: tuple[LeaseChange, ...]
    names: Mapping[str, str]

    def name(self, user: str) -> str:
        return self.names.get(user, user)


def simulate(
    db: Database,
    in_force: Policy,
    candidate: Policy,
    *,
    since: datetime,
    until: datetime,
    busy_pct: float = BUSY_PCT,
    step: timedelta = STEP,
) -> Simulation:
    """Replay [since, until) through both policies on the pure reference engine (the fastest
    for a batch; a property test proves it agrees with durable)."""
    engines = (ReferenceEngine(in_force), ReferenceEngine(candidate))
    replays = [SweepReplay(p, e, step) for p, e in zip((in_force, candidate), engines, strict=True)]
    start = since.replace(second=0, microsecond=0)  # the stored minutes' grid
    with db.read() as session:
        asked = replay.requests_in(session, since, until)
        lives = replay.leases_in(session, since, until)
        traces = _Traces(session, start, until, busy_pct)
        swept: list[LeaseChange] = []
        unobserved = 0
        for life in lives:
            held = [traces.of(node, index) for node, index in life.slots]
            unobserved += all(trace is None for trace in held)
            before, after = (r.events(life, held, since=since, until=until) for r in replays)
            swept += lease_changes(life, before, after, until)
    deciders = (RequestDecisions(in_force, engines[0]), RequestDecisions(candidate, engines[1]))
    changed, skipped = _requests(asked, deciders)
    summary = summarise(len(asked), skipped, len(lives), changed, swept, unobserved=unobserved)
    return Simulation(
        in_force.revision,
        candidate.revision,
        since,
        until,
        summary,
        tuple(changed),
        tuple(swept),
        {**in_force.names, **candidate.names},
    )


def _requests(
    asked: Sequence[Asked], deciders: tuple[RequestDecisions, RequestDecisions]
) -> tuple[list[RequestChange], int]:
    """The requests whose outcome changes, and how many could not be replayed (facts missing,
    or recorded under another fact catalogue)."""
    changed, skipped = [], 0
    for one in asked:
        if one.facts is None:
            skipped += 1
            continue
        try:
            old, new = (decide(one.facts) for decide in deciders)
        except FactError:
            skipped += 1
            continue
        if str(old.verdict) == str(new.verdict):
            continue
        r = one.request
        changed.append(
            RequestChange(
                request=int(r.id or 0),
                kind=r.kind,
                user=r.requester,
                pool=r.pool,
                gpus=r.gpus,
                before=str(old.verdict),
                after=str(new.verdict),
                deciding=new.deciding,
                because=new.because,
                waited_s=one.waited_s,
            )
        )
    return changed, skipped


class _Traces:
    """Each GPU's stored minutes over the window, read a node at a time when first needed."""

    def __init__(self, session: Session, start: datetime, until: datetime, busy_pct: float):
        self._session, self._start, self._until, self._busy = session, start, until, busy_pct
        self._nodes: dict[str, dict[int, GpuTrace]] = {}

    def of(self, node: str, index: int) -> GpuTrace | None:
        """None: nothing was ever stored for that GPU in the window (unknown throughout)."""
        if node not in self._nodes:
            states = replay.minute_states(
                self._session, node, self._start, self._until, busy_pct=self._busy
            )
            self._nodes[node] = {i: GpuTrace(self._start, s) for i, s in states.items()}
        return self._nodes[node].get(index)


# ---- kept per revision, for /gpu admin reload ---------------------------------------------


def remember(db: Database, sim: Simulation, *, at: datetime, by: str) -> None:
    """Keep the summary of this simulation as the last one of its candidate revision."""
    s = sim.summary
    kept = {
        "days": round((sim.until - sim.since) / timedelta(days=1)),
        "changed": s.outcomes_changed,
        "added": s.reclaims_added,
        "removed": s.reclaims_removed,
        "gpu_h": s.gpu_h_freed,
        "people": len(s.people),
    }
    with db.write() as session:
        keyvalue.set_simulation(session, sim.candidate, json.dumps(kept), at=at, by=by)


def reload_note(db: Database, revision: str) -> str | None:
    """The one line `/gpu admin reload` adds when a simulation of `revision` was run."""
    with db.read() as session:
        kept = keyvalue.simulation(session, revision)
    if kept is None:
        return None
    try:
        s = json.loads(kept)
        return (
            f"A simulation of this revision over the last {_plural(s['days'], 'day')}: "
            f"{_plural(s['changed'], 'outcome')} change, {_plural(s['added'], 'more reclaim')}, "
            f"{s['removed']} fewer, {s['gpu_h']:g} GPU-h freed, "
            f"{_plural(s['people'], 'person', 'people')} affected."
        )
    except (ValueError, KeyError, TypeError):
        return None  # kept by another version in another shape: say nothing


def _plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


# ---- what the command prints --------------------------------------------------------------


def _at(when: datetime | None) -> str:
    return when.strftime("%Y-%m-%d %H:%M UTC") if when is not None else "never"


def summary_lines(sim: Simulation) -> list[str]:
    """The summary, as the table format prints it before the differences."""
    s = sim.summary
    kinds = ", ".join(f"{label}: {n}" for label, n in s.outcomes.items())
    skipped = f" ({s.not_replayed} without facts to replay)" if s.not_replayed else ""
    people = ", ".join(sim.name(p) for p in s.people) or "none"
    return [
        f"Simulated revision {sim.candidate} against {sim.in_force} in force, "
        f"{_at(sim.since)} to {_at(sim.until)}",
        f"requests replayed: {s.requests}{skipped}",
        f"outcomes changed: {s.outcomes_changed}" + (f" ({kinds})" if kinds else ""),
        f"leases replayed: {s.leases}{_unobserved(s.unobserved)}",
        f"would-have reclaims: {s.reclaims_added} added, {s.reclaims_removed} removed",
        f"warnings: {s.warnings_added} added, {s.warnings_removed} removed",
        f"GPU-h freed: {s.gpu_h_freed:g}",
        f"people affected: {people}",
    ]


def _unobserved(count: int) -> str:
    if not count:
        return ""
    return (
        f" ({count} with no stored minute of telemetry: unknown throughout, so no idle rule "
        "can act on them)"
    )


def request_line(sim: Simulation, c: RequestChange) -> str:
    note = f"; {c.queue_note}" if c.queue_note else ""
    return (
        f"R{c.request} {c.kind} of {c.gpus} {c.pool} by {sim.name(c.user)}: "
        f"{c.before} → {c.after} ({c.deciding}: {c.because}){note}"
    )


def lease_line(sim: Simulation, c: LeaseChange) -> str:
    life = c.lease
    head = f"L{life.id} of {sim.name(life.holder)} ({life.gpus} {life.pool}): {c.action} {c.reason}"
    if c.change == "added":
        what = f" at {_at(c.candidate)}, only under the candidate ({c.rule})"
    elif c.change == "removed":
        what = f" at {_at(c.in_force)}, only under the rules in force"
    else:
        what = f" {c.change}: at {_at(c.candidate)} instead of {_at(c.in_force)}"
    freed = f"; {c.freed_gpu_h:+.2f} GPU-h freed" if c.action == "reclaim" else ""
    return head + what + freed


def table(sim: Simulation) -> Iterator[str]:
    """The summary, then each difference on a line."""
    yield from summary_lines(sim)
    if not sim.requests and not sim.leases:
        yield "no differences"
        return
    yield "differences:"
    for r in sim.requests:
        yield request_line(sim, r)
    for c in sim.leases:
        yield lease_line(sim, c)


def jsonl(sim: Simulation) -> Iterator[str]:
    """One JSON object per difference, then {"summary": ...}."""
    for r in sim.requests:
        yield _dumps(
            {
                "type": "request",
                "request": r.request,
                "kind": r.kind,
                "person": sim.name(r.user),
                "user": r.user,
                "pool": r.pool,
                "gpus": r.gpus,
                "in_force": r.before,
                "candidate": r.after,
                "change": r.label,
                "deciding": r.deciding,
                "because": r.because,
                "queue": r.queue_note or None,
            }
        )
    for c in sim.leases:
        yield _dumps(
            {
                "type": "lease",
                "lease": c.lease.id,
                "person": sim.name(c.lease.holder),
                "user": c.lease.holder,
                "pool": c.lease.pool,
                "gpus": c.lease.gpus,
                "action": f"{c.action} {c.reason}",
                "change": c.change,
                "in_force_at": _iso(c.in_force),
                "candidate_at": _iso(c.candidate),
                "rule": c.rule,
                "gpu_h_freed": round(c.freed_gpu_h, 2),
            }
        )
    s = sim.summary
    yield _dumps(
        {
            "summary": {
                "in_force": sim.in_force,
                "candidate": sim.candidate,
                "since": sim.since.isoformat(),
                "until": sim.until.isoformat(),
                "requests": s.requests,
                "not_replayed": s.not_replayed,
                "outcomes_changed": s.outcomes_changed,
                "outcomes": dict(s.outcomes),
                "leases": s.leases,
                "leases_unobserved": s.unobserved,
                "reclaims_added": s.reclaims_added,
                "reclaims_removed": s.reclaims_removed,
                "warnings_added": s.warnings_added,
                "warnings_removed": s.warnings_removed,
                "gpu_h_freed": s.gpu_h_freed,
                "people": [sim.name(p) for p in s.people],
            }
        }
    )


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def _dumps(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
