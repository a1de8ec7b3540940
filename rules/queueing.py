"""The queue: in what order a pool's waiting borrows are served, and which of them may start
before those ahead of them (backfill).

Order. Each team's requests form their own queue in the pool: those inside the team's nominal
first, then the highest priority, then the earliest. The heads of the teams' queues are served
in this order:

1. a request inside its team's nominal quota (a guarantee) before one that borrows;
2. among borrowers, the team with the smallest fair-share key first: its recent usage (decayed
   GPU-hours) over its weight. Each request served adds its GPU-hours to its team's usage, so
   two teams with equal keys take turns instead of one team emptying its queue first;
3. then the higher priority, then the earlier arrival.

Backfill (`queue.backfill`). A request further back may start now:

- `reserve` (the default, as Slurm's backfill): when it fits the free GPUs and its lease ends
  before, or leaves room for, every earlier request still waiting for GPUs. Each such request
  holds a reservation at its expected start: the earliest time enough GPUs are free for its
  whole duration, counting the leases' end times (a lease past its end gives its GPUs back at
  the next sweep at the earliest) and the reservations before it;
- `best_effort` (Kueue's BestEffortFIFO): whenever it fits; a large request may wait long;
- `none`: never; the first request that waits holds up the pool.

Pure: the bot reads the pool, walks `Timeline` in serving order and decides each request with
the rules, telling them how many earlier requests a start now would delay.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from rules.domain import Priority
from rules.policy import Backfill, Quota


def rank(priority: str) -> int:
    """A priority's rank, high first; an unknown priority counts as normal."""
    try:
        return Priority(priority).rank
    except ValueError:
        return Priority.NORMAL.rank


@dataclass(frozen=True)
class Queued:
    """A queued borrow, as the queue orders it."""

    request: int
    team: str
    gpus: int
    priority: str
    created_at: datetime
    duration: timedelta = timedelta(0)


class _Demand(Protocol):
    @property
    def team(self) -> str: ...
    @property
    def gpus(self) -> int: ...


def inside_nominal(
    demands: Sequence[_Demand], used: Mapping[str, int], quotas: Mapping[str, Quota]
) -> list[bool]:
    """For each demand in order: does it fit its team's nominal, with the GPUs the team holds
    and its earlier demands that fit?"""
    promised: dict[str, int] = {}
    out = []
    for d in demands:
        quota = quotas.get(d.team)
        inside = (
            quota is not None
            and used.get(d.team, 0) + promised.get(d.team, 0) + d.gpus <= quota.nominal
        )
        if inside:
            promised[d.team] = promised.get(d.team, 0) + d.gpus
        out.append(inside)
    return out


def queue_order(
    queued: Sequence[Queued],
    used: Mapping[str, int],
    quotas: Mapping[str, Quota],
    usage: Mapping[str, float] | Callable[[], Mapping[str, float]] | None = None,
) -> list[tuple[Queued, bool]]:
    """The pool's queue in serving order, each with whether it is inside its team's nominal.

    `usage`: per team, its recent decayed GPU-hours in the pool (fair share), or what reads
    it (only called when two teams or more wait beyond their nominal); None or empty leaves
    fair share out (priority, then arrival)."""
    ranks = {q.request: rank(q.priority) for q in queued}
    by_priority = sorted(queued, key=lambda q: (-ranks[q.request], q.created_at, q.request))
    flags = inside_nominal(by_priority, used, quotas)
    lines: dict[str, deque[tuple[Queued, bool]]] = {}
    for item, inside in sorted(zip(by_priority, flags, strict=True), key=lambda f: not f[1]):
        lines.setdefault(item.team, deque()).append((item, inside))  # inside nominal first
    borrowing = {q.team for q, inside in zip(by_priority, flags, strict=True) if not inside}
    if callable(usage):
        usage = usage() if len(borrowing) > 1 else None
    spent = dict(usage or {})
    fair = bool(usage)
    weight = {team: (q.weight if (q := quotas.get(team)) else 1.0) for team in lines}
    out: list[tuple[Queued, bool]] = []

    def key(team: str) -> tuple[bool, float, int, datetime, int]:
        head, inside = lines[team][0]
        share = spent.get(team, 0.0) / weight[team] if fair and not inside else 0.0
        return (not inside, share, -ranks[head.request], head.created_at, head.request)

    while lines:
        team = min(lines, key=key)
        head, inside = lines[team].popleft()
        out.append((head, inside))
        if not lines[team]:
            del lines[team]
        spent[team] = spent.get(team, 0.0) + head.gpus * head.duration.total_seconds() / 3600
    return out


SOON = timedelta(minutes=1)  # the earliest a lease past its end gives its GPUs back: a sweep
# As Slurm's backfill looks only so deep: once this many requests hold reservations in a pool,
# those further back wait their turn (nobody behind them starts first, so nobody is delayed).
DEPTH = 100


@dataclass(frozen=True)
class Ending:
    """GPUs of a lease in the pool that come back free when it ends."""

    gpus: int
    at: datetime


@dataclass(frozen=True)
class Reservation:
    request: int
    gpus: int
    start: datetime
    end: datetime


class Timeline:
    """The pool's GPUs over time: free now, coming back as leases end, and promised to the
    requests that start now or hold a reservation. An estimate: leases may end early (a
    release) or late (an extension, a lease that overruns until reclaimed).

    Kept as a step function: `_avail[i]` GPUs are neither in use nor promised from `_times[i]`
    until the next breakpoint (the last one lasts for ever). The leases' ends are added as a
    question needs them, in order (a large pool has thousands; backfill looks at the first
    hundred or so): each answer is the one every end gives (see `_cover`)."""

    def __init__(self, now: datetime, free: int, ending: Iterable[Ending]) -> None:
        """`ending`: a sequence in any order, or an iterable in order of `at`, consumed only
        as far as the questions asked need."""
        self.now = now
        self._times: list[datetime] = [now]
        self._avail: list[int] = [free]
        self.reservations: list[Reservation] = []
        # the ends still to add (from the first), the GPUs added and those promised so far
        self._pending = iter(sorted(ending, key=_at) if isinstance(ending, Sequence) else ending)
        self._next: Ending | None = None
        self._added = free
        self._promised = 0
        self._pull()

    def _pull(self) -> None:
        """The next end that gives GPUs back, if any (a lease past its end holds its GPUs
        until the sweep reclaims it, then gives them back)."""
        self._next = next((e for e in self._pending if e.gpus > 0), None)

    def _cover(self, gpus: int) -> None:
        """Add ends, each time all those at the next instant, until the GPUs added (free now
        or at an end) exceed those promised by at least `gpus`, or none is left. Then from the
        last end added on, at least `gpus` are available at every instant, so no question
        about `gpus` or fewer finds a step there too short; before it, every end is added,
        and each step is as every end makes it. The ends not added would only raise the steps
        from a later instant on: `_blocked`, `earliest` and `available` up to there answer as
        with all of them."""
        while self._next is not None and self._added - self._promised < gpus:
            at = self._next.at
            while self._next is not None and self._next.at == at:
                self._add(max(at, self.now + SOON), None, self._next.gpus)
                self._added += self._next.gpus
                self._pull()

    def _through(self, at: datetime) -> None:
        """Add every end not later than `at` (what `available(at)` counts)."""
        while self._next is not None and max(self._next.at, self.now + SOON) <= at:
            self._add(max(self._next.at, self.now + SOON), None, self._next.gpus)
            self._added += self._next.gpus
            self._pull()

    @property
    def deep(self) -> bool:
        """Do as many requests hold reservations as backfill looks at (DEPTH)?"""
        return len(self.reservations) >= DEPTH

    def _split(self, at: datetime) -> int:
        """The index of the step that begins at `at`, made if needed."""
        i = bisect_right(self._times, at) - 1
        if self._times[i] == at:
            return i
        self._times.insert(i + 1, at)
        self._avail.insert(i + 1, self._avail[i])
        return i + 1

    def _add(self, start: datetime, end: datetime | None, gpus: int) -> None:
        first = self._split(start)
        last = self._split(end) if end is not None else len(self._times)
        for i in range(first, last):
            self._avail[i] += gpus

    def available(self, at: datetime) -> int:
        """GPUs neither in use nor promised at `at` (now or later)."""
        self._through(max(at, self.now))
        return self._avail[bisect_right(self._times, max(at, self.now)) - 1]

    def _blocked(self, gpus: int, start: datetime, end: datetime) -> int | None:
        """The first step within [start, end) with fewer than `gpus` available, if any."""
        self._cover(gpus)
        i = bisect_right(self._times, start) - 1
        while i < len(self._times) and self._times[i] < end:
            if self._avail[i] < gpus:
                return i
            i += 1
        return None

    def fits_now(self, gpus: int, duration: timedelta) -> bool:
        """May `gpus` start now for `duration` without delaying any reservation?"""
        return self._blocked(gpus, self.now, self.now + duration) is None

    def delays(self, gpus: int, duration: timedelta) -> list[int]:
        """The earlier requests a start now would delay: those whose reservation begins while
        the lease would run and leaves too few GPUs for it. Empty when it may start now, and
        when it cannot start anyway (too few GPUs are free)."""
        end = self.now + duration
        if self.available(self.now) < gpus or self.fits_now(gpus, duration):
            return []  # it may start now, or it cannot anyway: the GPUs are not free
        return [
            r.request
            for r in self.reservations
            if r.start < end and r.end > self.now and self.available(r.start) < gpus
        ]

    def start(self, gpus: int, duration: timedelta) -> None:
        """A lease of `gpus` starts now."""
        self._add(self.now, self.now + duration, -gpus)
        self._promised += gpus

    def earliest(
        self, gpus: int, duration: timedelta, not_before: datetime | None = None
    ) -> datetime | None:
        """When `gpus` are free for `duration`, counting ends and reservations; None when the
        pool's GPUs never stretch that far."""
        at = max(self.now, not_before or self.now)
        while True:
            blocked = self._blocked(gpus, at, at + duration)
            if blocked is None:
                return at
            if blocked + 1 >= len(self._times):
                return None
            at = self._times[blocked + 1]  # any start before it runs into the blocked step

    def reserve(
        self, request: int, gpus: int, duration: timedelta, not_before: datetime | None = None
    ) -> datetime | None:
        """Hold the earliest slot for a request that has to wait; its expected start."""
        at = self.earliest(gpus, duration, not_before)
        if at is not None:
            self._add(at, at + duration, -gpus)
            self._promised += gpus
            self.reservations.append(Reservation(request, gpus, at, at + duration))
        return at


def _at(ending: Ending) -> datetime:
    return ending.at


@dataclass(frozen=True)
class Slot:
    """Where a waiting request stands: when it is expected to start, whether it waits for
    GPUs to come free at all (else for the rules: a lending limit, a manager), and the earlier
    requests a start now would delay (`pool.queued` counts them)."""

    request: int
    start: datetime | None  # None: not known (it waits for the rules, or never fits)
    for_gpus: bool
    delays: tuple[int, ...] = ()


def expected_starts(
    waiting: Sequence[Queued], line: Timeline, backfill: Backfill
) -> dict[int, Slot]:
    """For the queue as it stands (in serving order, nothing in it startable now), each
    request's expected start. With `reserve`, each request that waits for GPUs holds the
    earliest slot that delays none before it; with `none`, nobody starts before those ahead;
    with `best_effort`, nothing is held, so the estimate counts only the leases' ends."""
    out: dict[int, Slot] = {}
    before: list[int] = []
    floor: datetime | None = None
    blocked = False
    for q in waiting:
        if line.deep:  # too far back to foresee: it waits its turn
            out[q.request] = Slot(q.request, None, True, tuple(before))
            continue
        for_gpus = not line.fits_now(q.gpus, q.duration)
        delays: tuple[int, ...] = ()
        if backfill == Backfill.BEST_EFFORT:
            start = line.earliest(q.gpus, q.duration) if for_gpus else None
        elif backfill == Backfill.NONE:  # behind a waiting request, it waits for that one
            delays = tuple(before)
            start = None if blocked else line.reserve(q.request, q.gpus, q.duration, floor)
            if not (for_gpus or before):
                start = None  # a head that fits now waits for the rules
            blocked, floor, for_gpus = blocked or start is None, start, for_gpus or bool(before)
        else:
            delays = tuple(line.delays(q.gpus, q.duration))
            start = line.reserve(q.request, q.gpus, q.duration) if for_gpus else None
        out[q.request] = Slot(q.request, start, for_gpus, delays)
        before.append(q.request)
    return out
