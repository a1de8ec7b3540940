"""What a candidate policy would have done with the recorded history, next to the policy in
force: the outcome each policy gives a request's stored facts, the sweep actions each takes over
a lease's life (replayed by rules.sweep_replay) told apart, and the differences counted. Pure:
the service reads the history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from rules.decision import Decision
from rules.domain import Subject
from rules.engine import RuleEngine, decide
from rules.facts import minutes
from rules.memo import PassDecisions
from rules.policy import Policy
from rules.quota import enforce
from rules.sweep_replay import LeaseLife, SweepEvent

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


class RequestDecisions:
    """`request_decision` for a whole history under one policy. Recorded requests repeat
    their facts (the same people ask for the same pools and sizes), so each distinct set of
    stored facts is decided once, and each distinct combination of what the conditions read
    is matched once (rules.memo). The policy is fixed for the run: nothing goes stale."""

    def __init__(self, policy: Policy, engine: RuleEngine) -> None:
        self.policy = policy
        self._decisions = PassDecisions(lambda: (policy, engine))
        self._seen: dict[tuple[Any, ...], Decision] = {}

    def __call__(self, facts: Mapping[str, Any]) -> Decision:
        """As `request_decision(policy, engine, facts)`; raises FactError as it does."""
        try:
            # Types are part of the key: 1, 1.0 and True are equal in Python, not as facts.
            key = (*facts.items(), *map(type, facts.values()))
            found = self._seen.get(key)
        except TypeError:  # a value that cannot be hashed (a list kept in the facts)
            return self._decide(facts)
        if found is None:
            found = self._seen[key] = self._decide(facts)
        return found

    def _decide(self, facts: Mapping[str, Any]) -> Decision:
        fresh = refreshed(self.policy, facts)
        return enforce(self._decisions.decide(Subject.REQUEST, fresh))


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
    unobserved: int = 0  # leases with no stored minute at all: unknown throughout, never idle
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
    *,
    unobserved: int = 0,
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
        unobserved=unobserved,
        reclaims_added=count("reclaim", "added"),
        reclaims_removed=count("reclaim", "removed"),
        warnings_added=count("warn", "added"),
        warnings_removed=count("warn", "removed"),
        gpu_h_freed=round(sum(s.freed_gpu_h for s in swept), 2),
        people=tuple(sorted(people)),
    )
