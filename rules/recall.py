"""Lender recall: which borrowed leases give their GPUs back when a team needs its nominal.

A queued request that fits inside its team's nominal quota is a guarantee: the pool's GPUs
it waits for are held by teams above their own nominal, that is, borrowed. The planner walks
the pool's queue in serving order (rules.queueing), adds up what the guaranteed requests
need beyond the free GPUs, and covers that shortfall with recalls:

1. recalls already under way stand, oldest first, as long as they are needed; the rest are
   withdrawn (the GPUs came free some other way, or the request went);
2. a team's nominal covers its highest-priority leases, the earliest granted first among
   equals, and what lies beyond is borrowed; new victims are leases holding borrowed GPUs,
   lowest priority first, then the most recently granted: first those holding only borrowed
   GPUs, and a lease that holds some of its team's nominal as well only when nothing else
   covers the need;
3. never a protected lease, never one younger than `min_runtime`, never a holder preempted (or
   warned of a preemption) within `cooldown`, unless a guarantee still short has waited
   `max_guarantee_wait`: then the cooldown yields, the least recently preempted holder first,
   so the cooldown spreads recalls over holders but never holds a guarantee up for longer.

Each recall is owed to the guaranteed request whose shortfall it covers, in queue order.

With `preemption.within_team: lower_priority`, the same plan goes on: a waiting request that
the free GPUs and those coming back do not cover takes its own team's leases of strictly lower
priority, with the same exemptions (the cooldown held strictly), kept and withdrawn alike.

Pure: the bot reads the pool, calls `plan`, and applies the plan in one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from rules.domain import format_duration, plural
from rules.policy import Quota, Recall
from rules.queueing import inside_nominal, rank


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
    recalled_for: int = 0  # ... for this request
    usable: int | None = None  # GPUs that come back free if reclaimed (None: all of them)
    within_team: bool = False  # the recall under way is for a request of its own team

    @property
    def returns(self) -> int:
        """What reclaiming it gives the queue: GPUs on a drained node or unhealthy give none."""
        return self.gpus if self.usable is None else self.usable


@dataclass(frozen=True)
class Waiting:
    """A queued borrow in the pool, in queue order."""

    request: int
    team: str
    gpus: int
    waited: timedelta = timedelta(0)  # since it was asked for
    priority: str = "normal"


@dataclass(frozen=True)
class Victim:
    lease: int
    holder: str
    team: str
    gpus: int
    request: int  # the guaranteed request it makes room for
    for_team: str  # that request's team, the lender (or its own team, within the team)
    because: str
    within_team: bool = False  # preempted for a higher-priority request of its own team


@dataclass(frozen=True)
class Plan:
    need: int  # GPUs the guaranteed requests wait for beyond the free ones
    keep: tuple[int, ...] = ()  # recalls under way that still stand
    start: tuple[Victim, ...] = ()  # new recalls
    withdraw: tuple[int, ...] = ()  # recalls no longer needed
    passed_over: Mapping[int, str] = field(default_factory=dict)  # lease -> why not chosen
    reassign: tuple[Victim, ...] = ()  # recalls that stand, now owed to another request
    guaranteed: tuple[int, ...] = ()  # the requests inside their team's nominal
    covered: int = 0  # GPUs the kept and new lender recalls give back
    # request -> its team's lower-priority leases it may not preempt now, with why
    passed_within: Mapping[int, Mapping[int, str]] = field(default_factory=dict)

    @property
    def short(self) -> int:
        """GPUs still missing after every possible recall (waiting for leases to end)."""
        return max(0, self.need - self.covered)


def borrowed_parts(
    holdings: Sequence[Holding],
    quotas: Mapping[str, Quota],
    used: Mapping[str, int] | None = None,
) -> dict[int, int]:
    """How many of each lease's GPUs are borrowed. A team's nominal covers its highest-priority
    leases first, the earliest granted first among equals; whatever lies beyond is borrowed, so
    the borrowed share falls on the lowest priority, most recently granted leases: counted from
    them back, they hold the team's GPUs beyond its nominal. `used`, the GPUs each team holds,
    when `holdings` are not all its leases: they must then hold those of its leases that hold
    borrowed GPUs (`storage.leases.borrowing`), and any others of them get none."""
    if used is None:
        counted: dict[str, int] = {}
        for h in holdings:
            counted[h.team] = counted.get(h.team, 0) + h.gpus
        used = counted
    out: dict[int, int] = {}
    beyond: dict[str, int] = {}  # per team, its GPUs beyond its nominal not yet placed
    for h in sorted(
        holdings, key=lambda h: (-rank(h.priority), h.granted_at, h.lease), reverse=True
    ):
        if h.team not in beyond:
            quota = quotas.get(h.team)
            beyond[h.team] = used.get(h.team, 0) - (quota.nominal if quota is not None else 0)
        out[h.lease] = min(h.gpus, max(0, beyond[h.team]))
        beyond[h.team] -= h.gpus
    return out


class _Claims:
    """What each guarantee still lacks once the free GPUs went to those before it, handed
    out to recalled GPUs in queue order."""

    def __init__(self, guaranteed: Sequence[Waiting], free: int) -> None:
        self._open: list[list[Any]] = []
        spare = free
        for w in guaranteed:
            short = w.gpus - min(spare, w.gpus)
            spare -= w.gpus - short
            if short:
                self._open.append([w, short])
        self.need = sum(short for _, short in self._open)

    def take(self, gpus: int) -> Waiting:
        """The guarantee the next `gpus` recalled GPUs go to."""
        waiting: Waiting = self._open[0][0]
        while gpus > 0 and self._open:
            waiting = self._open[0][0]
            took = min(gpus, self._open[0][1])
            self._open[0][1] -= took
            gpus -= took
            if self._open[0][1] == 0:
                self._open.pop(0)
        return waiting


def plan(
    quotas: Mapping[str, Quota],
    holdings: Sequence[Holding],
    queue: Sequence[Waiting],
    free: int,
    *,
    now: datetime,
    recall: Recall,
    cooled: Mapping[str, datetime] | Collection[str] = (),
    within_team: bool = False,
    used: Mapping[str, int] | None = None,
) -> Plan:
    """What recall should do in one pool now. `queue` is in serving order; `cooled`: holders
    preempted (or warned of a preemption) within the cooldown, with when, where known;
    `within_team`: a waiting request may also preempt its own team's lower-priority leases.

    `used`, the GPUs each team holds in the pool, when known: `holdings` may then be only the
    leases this plan can touch (`touched`), the same plan as over every lease of the pool."""
    if used is None:
        counted: dict[str, int] = {}
        for h in holdings:
            counted[h.team] = counted.get(h.team, 0) + h.gpus
        used = counted
    # Which queued requests are guarantees: inside nominal with the team's earlier ones.
    inside = inside_nominal(queue, used, quotas)
    guaranteed = [w for w, fits in zip(queue, inside, strict=True) if fits]
    claims = _Claims(guaranteed, free)
    overdue = _overdue(guaranteed, recall.max_guarantee_wait)
    borrowed = borrowed_parts(holdings, quotas, used)
    standing = _under_way(holdings, borrowed, claims)
    new = _Recruit(
        claims=claims,
        borrowed=borrowed,
        covered=standing.covered,
        losing=frozenset(h.holder for h in holdings if h.lease in standing.keep),
    )
    new.recruit(holdings, used, quotas, now=now, recall=recall, cooled=cooled)
    if overdue is not None:
        new.override_cooldown(
            holdings, used, quotas, cooled=_when(cooled), overdue=overdue, recall=recall
        )
    # What the lender recalls leave uncovered, a request may take from its own team.
    chosen = {*standing.keep, *(v.lease for v in new.start)}
    team = _WithinTeam(
        spare=free + new.covered,
        chosen=chosen,
        losing={h.holder for h in holdings if h.lease in chosen},
    )
    if within_team:
        team.preempt(holdings, queue, now=now, recall=recall, cooled=cooled)
    return Plan(
        need=claims.need,
        keep=(*standing.keep, *team.keep),
        start=(*new.start, *team.start),
        withdraw=(*standing.withdraw, *team.withdrawn(holdings)),
        passed_over=new.passed,
        reassign=(*standing.reassign, *team.reassign),
        guaranteed=tuple(w.request for w in guaranteed),
        covered=new.covered,
        passed_within=team.passed,
    )


def touched(
    holding: Holding, used: Mapping[str, int], quotas: Mapping[str, Quota], within_team: bool
) -> bool:
    """Can `plan` start, keep, reassign, withdraw or pass over this lease? Without preemption
    within a team, only a lease being recalled or one of a team above its nominal (the only
    leases holding borrowed GPUs: a team at or below it has none, whatever its leases'
    order; and of such a team, only those that hold some, `borrowed_parts`) can; every lease
    can when a request may preempt its own team's."""
    if within_team or holding.recalled_at is not None:
        return True
    return touched_team(holding.team, used, quotas)


def touched_team(team: str, used: Mapping[str, int], quotas: Mapping[str, Quota]) -> bool:
    """Does `team` hold more than its nominal (so that its leases hold borrowed GPUs)?"""
    quota = quotas.get(team)
    return used.get(team, 0) > (quota.nominal if quota is not None else 0)


def _overdue(guaranteed: Sequence[Waiting], bound: timedelta) -> Waiting | None:
    """The guarantee that has waited longest, if it has waited `bound` or more."""
    longest = max(guaranteed, key=lambda w: w.waited, default=None)
    return longest if longest is not None and longest.waited >= bound else None


def _when(cooled: Mapping[str, datetime] | Collection[str]) -> dict[str, datetime]:
    """When each cooled holder was last preempted or warned; unknown counts as longest ago."""
    if isinstance(cooled, Mapping):
        return dict(cooled)
    return dict.fromkeys(cooled, datetime.min.replace(tzinfo=UTC))


@dataclass
class _Standing:
    """The recalls under way: those kept (some now for another request) and those withdrawn."""

    keep: list[int] = field(default_factory=list)
    reassign: list[Victim] = field(default_factory=list)
    withdraw: list[int] = field(default_factory=list)
    covered: int = 0


def _under_way(
    holdings: Sequence[Holding], borrowed: Mapping[int, int], claims: _Claims
) -> _Standing:
    out = _Standing()
    under_way = sorted(
        (h for h in holdings if h.recalled_at is not None and not h.within_team),
        key=lambda h: (h.recalled_at, h.lease),
    )
    for h in under_way:
        # A recall stands while it is needed and the lease still holds borrowed GPUs (an
        # earlier lease of its team may have ended, leaving this one inside the nominal).
        if out.covered < claims.need and borrowed.get(h.lease, 0) > 0 and h.returns > 0:
            out.keep.append(h.lease)
            out.covered += h.returns
            owed = claims.take(h.returns)
            if owed.request != h.recalled_for:  # what it was recalled for went, others wait
                because = f"it now makes room for R{owed.request} of team {owed.team}"
                out.reassign.append(
                    Victim(h.lease, h.holder, h.team, h.gpus, owed.request, owed.team, because)
                )
        else:
            out.withdraw.append(h.lease)
    return out


@dataclass
class _Recruit:
    """New recalls, chosen until the need is covered, and the leases passed over, with why."""

    claims: _Claims
    borrowed: Mapping[int, int]
    covered: int
    losing: frozenset[str]  # holders who already lose a lease to a recall under way
    start: list[Victim] = field(default_factory=list)
    passed: dict[int, str] = field(default_factory=dict)

    def recruit(
        self,
        holdings: Sequence[Holding],
        used: Mapping[str, int],
        quotas: Mapping[str, Quota],
        *,
        now: datetime,
        recall: Recall,
        cooled: Collection[str],
    ) -> None:
        borrowed = self.borrowed
        candidates = sorted(
            (h for h in holdings if h.recalled_at is None and borrowed.get(h.lease, 0) > 0),
            key=lambda h: (rank(h.priority), -h.granted_at.timestamp(), -h.lease),
        )
        # First the leases that hold only borrowed GPUs; one that holds some of its team's
        # nominal as well only when nothing else covers the need.
        for whole in (True, False):
            for h in candidates:
                if self.covered >= self.claims.need:
                    break
                if self._seen(h) or whole != (borrowed[h.lease] == h.gpus):
                    continue
                why_not = _why_not(h, now, recall, cooled) or self._losing(h)
                if why_not:
                    self.passed[h.lease] = why_not
                    continue
                self._take(h, used, quotas)

    def override_cooldown(
        self,
        holdings: Sequence[Holding],
        used: Mapping[str, int],
        quotas: Mapping[str, Quota],
        *,
        cooled: Mapping[str, datetime],
        overdue: Waiting,
        recall: Recall,
    ) -> None:
        """A guarantee waited past the bound: recall leases passed over only for the cooldown,
        the least recently preempted holder first."""
        cooling = [
            h
            for h in holdings
            if h.lease in self.passed and h.holder in cooled and not self._losing(h)
        ]
        cooling.sort(key=lambda h: (cooled[h.holder], rank(h.priority), h.lease))
        why = (
            f"the guarantee R{overdue.request} of team {overdue.team} waited "
            f"{format_duration(overdue.waited)}, past recall.max_guarantee_wait "
            f"({format_duration(recall.max_guarantee_wait)}); cooldown overridden"
        )
        for h in cooling:
            if self.covered >= self.claims.need:
                break
            if not self.passed[h.lease].endswith("(cooldown)"):  # protected, too young...
                continue
            del self.passed[h.lease]
            self._take(h, used, quotas, also=why)

    def _seen(self, h: Holding) -> bool:
        return h.lease in self.passed or any(v.lease == h.lease for v in self.start)

    def _losing(self, h: Holding) -> str:
        if h.holder in self.losing:
            return "its holder already loses another lease to a recall under way"
        return ""

    def _take(
        self,
        h: Holding,
        used: Mapping[str, int],
        quotas: Mapping[str, Quota],
        also: str = "",
    ) -> None:
        quota = quotas.get(h.team)
        nominal = quota.nominal if quota is not None else 0
        because = (
            f"team {h.team} holds {plural(used[h.team], 'GPU')} against a nominal of {nominal}, so "
            f"{used[h.team] - nominal} are borrowed (the nominal covers the team's highest-"
            f"priority leases); L{h.lease} holds {self.borrowed[h.lease]} of them and comes "
            "first among the borrowed leases that may be recalled (lowest priority, here "
            f"{h.priority}, then the most recently granted)"
        )
        if also:
            because = f"{because}; {also}"
        owed = self.claims.take(h.returns)
        self.start.append(
            Victim(h.lease, h.holder, h.team, h.gpus, owed.request, owed.team, because)
        )
        self.covered += h.returns


def _why_not(h: Holding, now: datetime, recall: Recall, cooled: Collection[str]) -> str:
    if h.protected:
        return "protected leases are never recalled"
    if h.returns == 0:
        return "its GPUs would not come back usable (drained or unhealthy)"
    age = now - h.granted_at
    if age < recall.min_runtime:
        left = format_duration(recall.min_runtime - age)
        minimum = format_duration(recall.min_runtime)
        return f"too young to recall for another {left} (minimum runtime {minimum})"
    if h.holder in cooled:
        cooldown = format_duration(recall.cooldown)
        return f"its holder was preempted or warned within the last {cooldown} (cooldown)"
    return ""


@dataclass
class _WithinTeam:
    """Preemption within a team by priority. Each waiting request, in queue order, takes what
    is left of the free GPUs and those coming back; what it still lacks it takes from its own
    team's leases of strictly lower priority, the lowest first, then the most recently
    granted, until the shortfall is covered, and only when it can be covered: a request that
    would still not start preempts nobody. Recalls of this kind under way stand while a
    request of the team still needs them (the one they were made for first) and are withdrawn
    when none does. The cooldown holds strictly here: `max_guarantee_wait` is for guarantees."""

    spare: int  # free GPUs and those coming back, not yet counted on by the queue
    chosen: set[int]  # leases recalled already, under way or new
    losing: set[str]  # holders who already lose a lease to a recall
    keep: list[int] = field(default_factory=list)
    reassign: list[Victim] = field(default_factory=list)
    start: list[Victim] = field(default_factory=list)
    passed: dict[int, dict[int, str]] = field(default_factory=dict)  # request -> lease -> why

    def preempt(
        self,
        holdings: Sequence[Holding],
        queue: Sequence[Waiting],
        *,
        now: datetime,
        recall: Recall,
        cooled: Collection[str],
    ) -> None:
        standing = sorted(
            (h for h in holdings if h.recalled_at is not None and h.within_team),
            key=lambda h: (h.recalled_at, h.lease),
        )
        fresh = sorted(
            (h for h in holdings if h.recalled_at is None and h.lease not in self.chosen),
            key=lambda h: (rank(h.priority), -h.granted_at.timestamp(), -h.lease),
        )
        for w in queue:
            got = min(self.spare, w.gpus)
            self.spare -= got
            short = w.gpus - got
            if short > 0:
                short = self._stand(w, short, standing)
            if short > 0:
                short = self._recruit(w, short, fresh, now=now, recall=recall, cooled=cooled)
            self.spare -= min(0, short)  # a lease larger than the shortfall: the rest serves on

    def withdrawn(self, holdings: Sequence[Holding]) -> list[int]:
        """Recalls within a team under way that no request needs any more."""
        under_way = [h for h in holdings if h.recalled_at is not None and h.within_team]
        return [h.lease for h in under_way if h.lease not in self.keep]

    def _stand(self, w: Waiting, short: int, standing: Sequence[Holding]) -> int:
        """Keep the recalls under way that `w` may take, those made for it first."""
        mine = [h for h in standing if _outranked(h, w) and h.lease not in self.keep]
        for h in sorted(mine, key=lambda h: h.recalled_for != w.request):
            if short <= 0:
                break
            if h.returns == 0:
                continue
            self.keep.append(h.lease)
            self.losing.add(h.holder)
            short -= h.returns
            if h.recalled_for != w.request:  # what it was preempted for went, others wait
                because = f"it now makes room for R{w.request} of its own team {w.team}"
                self.reassign.append(_victim(h, w, because))
        return short

    def _recruit(
        self,
        w: Waiting,
        short: int,
        fresh: Sequence[Holding],
        *,
        now: datetime,
        recall: Recall,
        cooled: Collection[str],
    ) -> int:
        picked = []
        for h in fresh:
            if short <= 0:
                break
            if h.lease in self.chosen or not _outranked(h, w):
                continue
            why_not = _why_not(h, now, recall, cooled)
            if not why_not and h.holder in self.losing:
                why_not = "its holder already loses another lease to a recall"
            if why_not:
                self.passed.setdefault(w.request, {})[h.lease] = why_not
                continue
            picked.append(h)
            short -= h.returns
        if short > 0:
            return short  # it would still not start: nobody is preempted in vain
        for h in picked:
            because = (
                f"preempted for R{w.request}, a {w.priority}-priority request of your team "
                f"{w.team} that the free GPUs do not cover; L{h.lease} is {h.priority} "
                "priority and comes first among the team's lower-priority leases (lowest "
                "priority, then the most recently granted)"
            )
            self.start.append(_victim(h, w, because))
            self.chosen.add(h.lease)
            self.losing.add(h.holder)
        return short


def _outranked(h: Holding, w: Waiting) -> bool:
    """May `w` preempt `h`: the same team, and a strictly higher priority?"""
    return h.team == w.team and rank(h.priority) < rank(w.priority)


def _victim(h: Holding, w: Waiting, because: str) -> Victim:
    return Victim(h.lease, h.holder, h.team, h.gpus, w.request, w.team, because, within_team=True)
