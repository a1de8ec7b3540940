"""What a candidate policy would have done with the recorded history, next to the policy in
force: the outcome each policy gives a request's stored facts, and the sweep actions each takes
over a lease's life, stepped through its stored minutes. Pure: the service reads the history.

A replayed lease starts unwarned at the window's start (or its grant), sees no snooze and no
recall (people's clicks are not replayed), keeps its final expiry, and is warned the moment a
rule says so: a replayed warning is delivered at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Any

from rules.decision import Decision
from rules.domain import Subject
from rules.engine import RuleEngine, decide
from rules.facts import minutes
from rules.lease_facts import LeaseSnapshot, Warned, expiry_stage, lease_facts
from rules.marks import Marks
from rules.policy import Policy
from rules.quota import enforce
from rules.reclaim import Do, lease_steps

MINUTE = timedelta(minutes=1)
STEP = timedelta(minutes=5)


# ---- requests -----------------------------------------------------------------------------


def refreshed(policy: Policy, facts: Mapping[str, Any]) -> dict[str, Any]:
    """A request's stored facts with what the policy itself says re-read from `policy`: who is a
    manager or an admin, the team's quota, the pool's size and limits. What the pool looked like
    then (held, free, queued, lendable) stays as it was recorded."""
    out = dict(facts)
    user, team, pool = facts.get("user.id"), facts.get("user.team"), facts.get("request.pool")
    if isinstance(user, str):
        out["user.is_admin"] = policy.is_admin(user)
        if team in policy.teams:
            out["user.is_manager"] = user in policy.teams[str(team)].managers
    if pool not in policy.pools:
        return out
    p = policy.pools[str(pool)]
    out |= {
        "pool.size": p.size,
        "pool.protected": p.protected,
        "limits.max_gpus_per_request": p.limits.max_gpus_per_request,
        "limits.max_duration": minutes(p.limits.max_duration),
        "limits.max_extensions": p.limits.max_extensions,
        "limits.max_extension_total": minutes(p.limits.max_extension_total),
    }
    quota = p.quotas.get(str(team))
    if quota is not None and "team.used_after" in facts:
        out |= {
            "team.nominal": quota.nominal,
            "team.borrowing_limit": quota.borrowing_limit,
            "team.lending_limit": quota.lending_limit,
            "team.limit": quota.nominal + quota.borrowing_limit,
            "team.borrowed_after": max(0, int(facts["team.used_after"]) - quota.nominal),
        }
    return out


def request_decision(policy: Policy, engine: RuleEngine, facts: Mapping[str, Any]) -> Decision:
    """The decision `policy` gives the stored facts, with the quota invariant the code adds.
    Raises FactError when the facts are not those of today's catalogue."""
    return enforce(decide(policy, engine, Subject.REQUEST, refreshed(policy, facts)))


@dataclass(frozen=True)
class RequestChange:
    """A request whose outcome differs: `before` under the rules in force, `after` under the
    candidate (e.g. "approve", "ask managers"), the rule that decides it now and why.
    `waited_s`: how long the real request waited for its GPUs, when it did."""

    request: int
    kind: str
    user: str
    pool: str
    gpus: int
    before: str
    after: str
    deciding: str
    because: str
    waited_s: float | None = None

    @property
    def label(self) -> str:
        """The kind of change, outcome words only: "approve → ask"."""
        return f"{_word(self.before)} → {_word(self.after)}"

    @property
    def queue_note(self) -> str:
        """What the change does to the request's wait: an estimate, never a re-run queue."""
        if _word(self.after) == "queue" and _word(self.before) != "queue":
            return "would wait in the queue (how long is not simulated)"
        if _word(self.before) != "queue" or _word(self.after) == "queue":
            return ""
        if self.waited_s is None:
            return "would not wait in the queue"
        return f"would not wait in the queue (an estimate: it waited {_span(self.waited_s)})"


def _word(outcome: str) -> str:
    return outcome.split(maxsplit=1)[0] if outcome else outcome


def _span(seconds: float) -> str:
    total = round(seconds / 60)
    hours, mins = divmod(total, 60)
    if hours and mins:
        return f"{hours}h {mins}m"
    return f"{hours}h" if hours else f"{mins}m"


# ---- telemetry from the stored minutes ----------------------------------------------------


class Minute(IntEnum):
    """One stored minute of one GPU: no working reading, all readings idle, or busy."""

    UNKNOWN = 0
    IDLE = 1
    BUSY = 2


@dataclass(frozen=True)
class MinuteReading:
    """A GPU as the sweep would have read it, rebuilt from the stored minutes (no health or
    processes are kept per minute: healthy, nobody else's work)."""

    fresh: bool
    idle_for: timedelta
    util_pct: float | None = None
    healthy: bool = True
    health: str = "ok"
    memory_used_mib: int | None = None
    processes: tuple[Any, ...] = ()


class GpuTrace:
    """One GPU's minutes from `start` (a minute boundary), one state each; what is not stored
    is unknown, and unknown is never idle (invariant 3)."""

    def __init__(self, start: datetime, states: bytes | bytearray | Sequence[Minute]) -> None:
        self.start = start
        self.states = bytes(states)
        runs, last = [], []
        run, seen = 0, -1
        for i, state in enumerate(self.states):
            run = run + 1 if state == Minute.IDLE else 0
            seen = i if state != Minute.UNKNOWN else seen
            runs.append(run)
            last.append(seen)
        self._idle_run, self._last_seen = runs, last

    def reading(self, now: datetime, stale_after: timedelta) -> MinuteReading:
        """Fresh when a working minute ended within `stale_after`; idle for the idle minutes
        in a row up to that one (a busy or unknown minute ends the stretch)."""
        done = int((now - self.start) / MINUTE)  # minutes complete at `now`
        if done <= 0:
            return MinuteReading(False, timedelta(0))
        k = min(done, len(self.states)) - 1
        seen = self._last_seen[k]
        if seen < 0 or now - (self.start + (seen + 1) * MINUTE) > stale_after:
            return MinuteReading(False, timedelta(0))
        return MinuteReading(True, self._idle_run[seen] * MINUTE)


def minute_state(util_max_pct: float | None, ok_samples: int, busy_pct: float) -> Minute:
    """A stored minute as the sweep reads it: any busy reading makes it busy."""
    if ok_samples <= 0 or util_max_pct is None:
        return Minute.UNKNOWN
    return Minute.BUSY if util_max_pct >= busy_pct else Minute.IDLE


# ---- leases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseLife:
    """A lease as it ran: its GPUs, its times; `ended_at` None while it still runs."""

    id: int
    holder: str
    team: str
    pool: str
    gpus: int
    priority: str
    protected: bool
    granted_at: datetime
    expires_at: datetime
    ended_at: datetime | None
    slots: tuple[tuple[str, int], ...]

    def end(self, until: datetime) -> datetime:
        """When it stopped holding its GPUs, within the window."""
        return min(self.ended_at or until, until)


@dataclass(frozen=True)
class SweepEvent:
    """The first time a policy's sweep took one action (`warn`, `reclaim`, `shrink`,
    `notify`) for one reason on a lease."""

    action: str
    reason: str
    at: datetime
    rule: str

    @property
    def key(self) -> str:
        return f"{self.action} {self.reason}"


@dataclass
class _State:
    marks: Marks = field(default_factory=Marks)
    delivered: dict[str, datetime] = field(default_factory=dict)
    events: dict[str, SweepEvent] = field(default_factory=dict)
    keys: list[datetime] = field(default_factory=list)  # moments a fact crosses a line

    def warned(self) -> Warned:
        return Warned(dict(self.delivered))


def replay_lease(
    policy: Policy,
    engine: RuleEngine,
    life: LeaseLife,
    traces: Sequence[GpuTrace | None],
    *,
    since: datetime,
    until: datetime,
    step: timedelta = STEP,
) -> tuple[SweepEvent, ...]:
    """Step through the lease's life in the window (every `step`, and at each moment an expiry
    lead, the expiry or a grace period ends) and apply the sweep rules of `policy` as the sweep
    would; the first event of each kind, up to the first reclaim, which ends the lease."""
    state = _State(keys=_expiry_keys(policy, life))
    t, end = max(life.granted_at, since), life.end(until)
    paused = policy.automation_paused
    while t < end:
        readings = [
            trace.reading(t, policy.timing.stale_after) if trace is not None else None
            for trace in traces
        ]
        snapshot = _snapshot(life, state.marks)
        warned = state.warned()
        facts = lease_facts(policy, snapshot, readings, warned, t)
        decision = decide(policy, engine, Subject.LEASE, facts)
        if _apply(policy, state, snapshot, decision, warned, now=t, paused=paused):
            break
        t = _next(state.keys, t, step)
    return tuple(sorted(state.events.values(), key=lambda e: e.at))


def _snapshot(life: LeaseLife, marks: Marks) -> LeaseSnapshot:
    return LeaseSnapshot(
        id=life.id,
        holder=life.holder,
        team=life.team,
        pool=life.pool,
        gpus=life.gpus,
        priority=life.priority,
        protected=life.protected,
        granted_at=life.granted_at,
        expires_at=life.expires_at,
        warnings=marks,
        snoozed_until=None,
        slots=life.slots,
    )


def _expiry_keys(policy: Policy, life: LeaseLife) -> list[datetime]:
    leads = [life.expires_at - lead for lead in policy.timing.expiry_leads]
    return sorted({*leads, life.expires_at, life.expires_at + policy.timing.grace})


def _next(keys: list[datetime], t: datetime, step: timedelta) -> datetime:
    nearer = [k for k in keys if t < k < t + step]
    return min(nearer, default=t + step)


def _apply(
    policy: Policy,
    state: _State,
    lease: LeaseSnapshot,
    decision: Decision,
    warned: Warned,
    *,
    now: datetime,
    paused: bool,
) -> bool:
    """Carry out one evaluation's steps on the replayed state; True once it reclaims."""
    t = now
    for step in lease_steps(lease, decision, warned, policy, t, paused=paused):
        if step.do == Do.FORGET:
            state.marks = state.marks.without(step.why)
            state.delivered.pop(step.why, None)
            continue
        if step.do not in (Do.WARN, Do.RECLAIM, Do.SHRINK, Do.NOTIFY) or step.match is None:
            continue  # would-haves and held-back reclaims change nothing
        event = SweepEvent(str(step.do), str(step.reason), t, step.match.rule)
        state.events.setdefault(event.key, event)
        if step.do == Do.WARN:
            _warn(policy, state, lease, str(step.reason), decision, now=t)
        elif step.do == Do.RECLAIM:
            return True
    return False


def _warn(
    policy: Policy,
    state: _State,
    lease: LeaseSnapshot,
    reason: str,
    decision: Decision,
    *,
    now: datetime,
) -> None:
    """One warning per reason; expiry again only when a nearer lead time is crossed."""
    t = now
    again = reason == "expiry" and decision.facts["lease.expiry_warning_due"]
    if state.marks.warned(reason) and not again:
        return
    stage = expiry_stage(policy, lease, t) if reason == "expiry" else None
    state.marks = state.marks.with_warning(reason, outbox=None, owed_at=t, lead_min=stage or 0.0)
    state.delivered[reason] = t
    state.keys += [t + policy.timing.grace, t + policy.recall.notice]


# ---- the differences ----------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseChange:
    """One sweep action on one lease that the two policies take differently: only under the
    candidate (`added`), only under the rules in force (`removed`), or at another time.
    `freed_gpu_h`: for a reclaim, the GPU-h the candidate frees beyond the rules in force
    (allocated time from the reclaim to the lease's real end; negative when it frees less)."""

    lease: LeaseLife
    action: str
    reason: str
    in_force: datetime | None
    candidate: datetime | None
    rule: str
    freed_gpu_h: float = 0.0

    @property
    def change(self) -> str:
        if self.in_force is None:
            return "added"
        if self.candidate is None:
            return "removed"
        return "earlier" if self.candidate < self.in_force else "later"


def freed_gpu_h(life: LeaseLife, at: datetime | None, until: datetime) -> float:
    """GPU-h a reclaim at `at` frees: the lease's GPUs from then to its real end."""
    if at is None:
        return 0.0
    return life.gpus * max(0.0, (life.end(until) - at).total_seconds()) / 3600


def lease_changes(
    life: LeaseLife,
    in_force: Iterable[SweepEvent],
    candidate: Iterable[SweepEvent],
    until: datetime,
) -> list[LeaseChange]:
    """The actions the policies take differently on one lease, in the order of the events."""
    before = {e.key: e for e in in_force}
    after = {e.key: e for e in candidate}
    out = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key), after.get(key)
        if old is not None and new is not None and old.at == new.at:
            continue
        some = new or old
        assert some is not None
        change = LeaseChange(
            life,
            some.action,
            some.reason,
            old.at if old is not None else None,
            new.at if new is not None else None,
            some.rule,
        )
        if some.action == "reclaim":
            freed = freed_gpu_h(life, change.candidate, until)
            change = replace(change, freed_gpu_h=freed - freed_gpu_h(life, change.in_force, until))
        out.append(change)
    return sorted(out, key=lambda c: min(t for t in (c.in_force, c.candidate) if t is not None))


@dataclass(frozen=True)
class Summary:
    """The simulation in figures: what was replayed and what changes."""

    requests: int = 0
    not_replayed: int = 0
    outcomes: Mapping[str, int] = field(default_factory=dict)  # "approve → ask": count
    leases: int = 0
    reclaims_added: int = 0
    reclaims_removed: int = 0
    warnings_added: int = 0
    warnings_removed: int = 0
    gpu_h_freed: float = 0.0
    people: tuple[str, ...] = ()

    @property
    def outcomes_changed(self) -> int:
        return sum(self.outcomes.values())


def summarise(
    requests: int,
    not_replayed: int,
    leases: int,
    changed: Sequence[RequestChange],
    swept: Sequence[LeaseChange],
) -> Summary:
    """Count the changes; people are the requesters and holders they touch, sorted."""
    outcomes: dict[str, int] = {}
    for c in changed:
        outcomes[c.label] = outcomes.get(c.label, 0) + 1

    def count(action: str, change: str) -> int:
        return sum(1 for s in swept if s.action == action and s.change == change)

    people = {c.user for c in changed} | {s.lease.holder for s in swept}
    return Summary(
        requests=requests,
        not_replayed=not_replayed,
        outcomes=dict(sorted(outcomes.items())),
        leases=leases,
        reclaims_added=count("reclaim", "added"),
        reclaims_removed=count("reclaim", "removed"),
        warnings_added=count("warn", "added"),
        warnings_removed=count("warn", "removed"),
        gpu_h_freed=round(sum(s.freed_gpu_h for s in swept), 2),
        people=tuple(sorted(people)),
    )
