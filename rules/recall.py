"""Lender recall: which borrowed leases give their GPUs back when a team needs its nominal.

A queued request that fits inside its team's nominal quota is a guarantee: the pool's GPUs
it waits for are held by teams above their own nominal, that is, borrowed. The planner walks
the pool's queue in its order (priority, then arrival), adds up what the guaranteed requests
need beyond the free GPUs, and covers that shortfall with recalls:

1. recalls already under way stand, oldest first, as long as they are needed; the rest are
   withdrawn (the GPUs came free some other way, or the request went);
2. new victims come only from teams holding more than their nominal, and only while that team
   still does: lowest priority first, then the most recently granted; first among leases whose
   team keeps its nominal without them, and only then a lease that takes it below (one lease
   holding nominal and borrowed GPUs together);
3. never a protected lease, never one younger than `min_runtime`, never a holder preempted
   within `cooldown`.

Pure: the bot reads the pool, calls `plan`, and applies the plan in one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rules.domain import Priority, format_duration
from rules.policy import Quota, Recall


@dataclass(frozen=True)
class Holding:
    """An active lease in the pool, as recall sees it."""

    lease: int
    holder: str
    team: str
    gpus: int
    priority: str
    granted_at: datetime
    protected: bool
    recalled_at: datetime | None = None  # under recall since then


@dataclass(frozen=True)
class Waiting:
    """A queued borrow in the pool, in queue order."""

    request: int
    team: str
    gpus: int


@dataclass(frozen=True)
class Victim:
    lease: int
    holder: str
    team: str
    gpus: int
    request: int  # the guaranteed request it makes room for
    for_team: str  # that request's team, the lender
    because: str


@dataclass(frozen=True)
class Plan:
    need: int  # GPUs the guaranteed requests wait for beyond the free ones
    keep: tuple[int, ...] = ()  # recalls under way that still stand
    start: tuple[Victim, ...] = ()  # new recalls
    withdraw: tuple[int, ...] = ()  # recalls no longer needed
    passed_over: Mapping[int, str] = field(default_factory=dict)  # lease -> why not chosen
    guaranteed: tuple[int, ...] = ()  # the requests inside their team's nominal
    covered: int = 0  # GPUs the kept and new recalls give back

    @property
    def short(self) -> int:
        """GPUs still missing after every possible recall (waiting for leases to end)."""
        return max(0, self.need - self.covered)


def _rank(priority: str) -> int:
    try:
        return Priority(priority).rank
    except ValueError:
        return Priority.NORMAL.rank


def plan(
    quotas: Mapping[str, Quota],
    holdings: Sequence[Holding],
    queue: Sequence[Waiting],
    free: int,
    *,
    now: datetime,
    recall: Recall,
    cooled: Collection[str] = (),
) -> Plan:
    """What recall should do in one pool now. `cooled`: holders preempted within cooldown."""
    used: dict[str, int] = {}
    for h in holdings:
        used[h.team] = used.get(h.team, 0) + h.gpus
    # Which queued requests are guarantees: inside nominal with the team's earlier ones.
    promised: dict[str, int] = {}
    guaranteed: list[Waiting] = []
    for w in queue:
        quota = quotas.get(w.team)
        after = used.get(w.team, 0) + promised.get(w.team, 0) + w.gpus
        if quota is not None and after <= quota.nominal:
            promised[w.team] = promised.get(w.team, 0) + w.gpus
            guaranteed.append(w)
    need = max(0, sum(w.gpus for w in guaranteed) - free)
    first = guaranteed[0] if guaranteed else Waiting(0, "", 0)

    keep: list[int] = []
    withdraw: list[int] = []
    covered = 0
    remaining = dict(used)
    under_way = sorted(
        (h for h in holdings if h.recalled_at is not None),
        key=lambda h: (h.recalled_at, h.lease),
    )
    for h in under_way:
        if covered < need:
            keep.append(h.lease)
            covered += h.gpus
            remaining[h.team] -= h.gpus
        else:
            withdraw.append(h.lease)

    start: list[Victim] = []
    passed: dict[int, str] = {}
    candidates = sorted(
        (h for h in holdings if h.recalled_at is None),
        key=lambda h: (_rank(h.priority), -h.granted_at.timestamp(), -h.lease),
    )
    # First only leases whose team stays at or above its nominal without them; a lease that
    # would take its team below (one lease holding nominal and borrowed GPUs together) only
    # when nothing else covers the need.
    for strict in (True, False):
        for h in candidates:
            if covered >= need:
                break
            if h.lease in passed or any(v.lease == h.lease for v in start):
                continue
            quota = quotas.get(h.team)
            nominal = quota.nominal if quota is not None else 0
            left = remaining.get(h.team, 0)
            if left <= nominal or (strict and left - h.gpus < nominal):
                continue  # not borrowing (any more): its own guarantee is not taken
            why_not = _why_not(h, now, recall, cooled)
            if why_not:
                passed[h.lease] = why_not
                continue
            because = (
                f"team {h.team} holds {left} GPUs against a nominal of {nominal}, so "
                f"{left - nominal} are borrowed; L{h.lease} is {h.priority} priority and among "
                "its most recently granted leases"
            )
            start.append(
                Victim(h.lease, h.holder, h.team, h.gpus, first.request, first.team, because)
            )
            covered += h.gpus
            remaining[h.team] = left - h.gpus
    return Plan(
        need=need,
        keep=tuple(keep),
        start=tuple(start),
        withdraw=tuple(withdraw),
        passed_over=passed,
        guaranteed=tuple(w.request for w in guaranteed),
        covered=covered,
    )


def _why_not(h: Holding, now: datetime, recall: Recall, cooled: Collection[str]) -> str:
    if h.protected:
        return "protected leases are never recalled"
    age = now - h.granted_at
    if age < recall.min_runtime:
        left = format_duration(recall.min_runtime - age)
        minimum = format_duration(recall.min_runtime)
        return f"younger than the minimum runtime of {minimum} (for {left} more)"
    if h.holder in cooled:
        return f"its holder was preempted within the last {format_duration(recall.cooldown)}"
    return ""
