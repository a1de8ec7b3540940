"""The sweep replayed over a lease's recorded life: readings rebuilt from the stored minutes
(rules.minute_trace), the lease facts rebuilt at each step, the sweep rules of one policy
applied as the sweep would.

A replayed lease starts unwarned at the window's start (or its grant), sees no snooze and no
recall (people's clicks are not replayed), keeps its final expiry, and is warned the moment a
rule says so: a replayed warning is delivered at once. Steps fall every `step` from the start,
and at each moment an expiry lead, the expiry or a grace period ends. Where nothing can change
(every GPU busy, or unknown, for a while, and no time a rule compares with is crossed) the
steps in between are skipped: they would decide the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from rules import expr
from rules.decision import Decision
from rules.domain import Subject
from rules.engine import RuleEngine, decide
from rules.lease_facts import LeaseSnapshot, Warned, expiry_stage, lease_facts
from rules.marks import Marks
from rules.memo import PassDecisions
from rules.minute_trace import MINUTE, GpuTrace
from rules.policy import Policy
from rules.reclaim import Do, lease_steps

STEP = timedelta(minutes=5)


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


# Facts that move with the clock alone, and where each is anchored: (anchor, sign).
_CLOCK_FACTS = {
    "lease.age": ("granted", 1),
    "lease.time_left": ("expires", -1),
    "lease.overdue": ("expires", 1),
    "lease.since_warned.expiry": ("expiry", 1),
    "lease.since_warned.idle": ("idle", 1),
    "lease.since_warned.partly_idle": ("partly_idle", 1),
    "lease.since_warned.preempt": ("preempt", 1),
}


# Facts that grow minute by minute while a lease's GPUs stay idle (and with its age).
_IDLE_FACTS = frozenset({"lease.idle_for", "lease.idle_gpus_for"})
_MOVING = _CLOCK_FACTS.keys() | _IDLE_FACTS


_Moving = tuple[str, expr.Fact | expr.Literal, str]  # (moving fact, the other side, operator)
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _moving_compares(node: expr.Node) -> list[_Moving] | None:
    """Each comparison of a moving fact (clock or idle time) with something that holds still,
    the moving fact read on the left (None: a comparison of two moving facts, or one in a
    list, whose crossing is not worked out)."""
    if isinstance(node, expr.Compare):
        sides = (node.left, node.right)
        moving = [s for s in sides if isinstance(s, expr.Fact) and s.name in _MOVING]
        if len(moving) == 2:
            return None
        if not moving:
            return []
        if moving[0] is node.left:
            return [(moving[0].name, node.right, node.op)]
        return [(moving[0].name, node.left, _FLIPPED[node.op])]
    if isinstance(node, expr.In):
        return None if node.fact.name in _MOVING else []
    if isinstance(node, expr.Not):
        return _moving_compares(node.operand)
    if isinstance(node, expr.BoolOp):
        out: list[_Moving] = []
        for operand in node.operands:
            found = _moving_compares(operand)
            if found is None:
                return None
            out += found
        return out
    return []


@dataclass
class _State:
    marks: Marks = field(default_factory=Marks)
    delivered: dict[str, datetime] = field(default_factory=dict)
    events: dict[str, SweepEvent] = field(default_factory=dict)
    keys: list[datetime] = field(default_factory=list)  # moments a fact crosses a line

    def warned(self) -> Warned:
        return Warned(dict(self.delivered))


class SweepReplay:
    """One policy's sweep rules, replayed lease by lease."""

    def __init__(
        self, policy: Policy, engine: RuleEngine, step: timedelta = STEP, *, skip: bool = True
    ) -> None:
        """`skip=False` evaluates every step, each decided afresh by the engine (the reference
        the skipping and the memo are proved against)."""
        self.policy, self.engine, self.step = policy, engine, step
        if skip:
            # A lease's facts repeat from step to step and lease to lease (a busy lease looks
            # like every other busy lease to the rules): each distinct combination of what the
            # conditions read is evaluated once. The policy is fixed, so nothing goes stale.
            self._decide = PassDecisions(lambda: (policy, engine)).decide
        else:
            self._decide = partial(decide, policy, engine)
        compares: list[_Moving] | None = [] if skip else None
        for rule in policy.rules_for(Subject.LEASE):
            found = _moving_compares(rule.condition)
            if found is None or compares is None:
                compares = None
                break
            compares += found
        self._compares = compares
        self._threshold = policy.timing.idle_threshold / MINUTE
        # The comparisons sorted out once, each kind once (several rules share a threshold):
        # (fact or None, literal) for what the moving fact is compared with.
        self._idle: list[tuple[str | None, float | None, str]] = []
        self._clock: list[tuple[str, int, str | None, float | None]] = []
        for name, other, op in compares or ():
            fact, value = (
                (None, other.value) if isinstance(other, expr.Literal) else (other.name, None)
            )
            if fact is None and (isinstance(value, bool) or not isinstance(value, int | float)):
                continue  # a literal that is not a number is never crossed
            if name in _IDLE_FACTS:
                one: Any = (fact, value, op)
                if one not in self._idle:
                    self._idle.append(one)
            else:
                one = (*_CLOCK_FACTS[name], fact, value)
                if one not in self._clock:
                    self._clock.append(one)

    def events(
        self,
        life: LeaseLife,
        traces: Sequence[GpuTrace | None],
        *,
        since: datetime,
        until: datetime,
    ) -> tuple[SweepEvent, ...]:
        """The first event of each kind over the lease's life in [since, until), up to the
        first reclaim, which ends the lease."""
        policy = self.policy
        state = _State(keys=_expiry_keys(policy, life))
        base = t = max(life.granted_at, since)
        end = life.end(until)
        grid = _Grid(base, self.step)
        stale = policy.timing.stale_after
        marks, snapshot, warned = state.marks, _snapshot(life, state.marks), state.warned()
        crossings: dict[tuple[Any, ...], list[datetime]] = {}  # this lease's, worked out once
        while t < end:
            readings = [tr.reading(t, stale) if tr is not None else None for tr in traces]
            if state.marks is not marks:  # a warning was given or forgotten since
                marks, snapshot, warned = state.marks, _snapshot(life, state.marks), state.warned()
            facts = lease_facts(policy, snapshot, readings, warned, t)
            decision = self._decide(Subject.LEASE, facts)
            # No rule matched and no warning to forget: no step to take (most steps).
            acts = decision.matches or state.delivered
            if acts and _apply(policy, state, snapshot, decision, warned, now=t):
                break
            last, t = t, min(grid.after(t), *filter(t.__lt__, state.keys))
            if state.marks is marks:  # nothing changed: skip what would decide the same
                found = self._next_change(
                    life, traces, state, facts, grid, crossings=crossings, last=last, end=end
                )
                t = max(t, found)
        return tuple(sorted(state.events.values(), key=lambda e: e.at))

    def _next_change(
        self,
        life: LeaseLife,
        traces: Sequence[GpuTrace | None],
        state: _State,
        facts: dict[str, Any],
        grid: _Grid,
        *,
        crossings: dict[tuple[Any, ...], list[datetime]],
        last: datetime,
        end: datetime,
    ) -> datetime:
        """The first step after `last` where the decision made at `last` may no longer hold:
        a reading changes other than by an idle GPU's minutes adding up, a time a rule
        compares a moving fact with is crossed, a GPU's idle time reaches the idle threshold,
        or a key moment comes (`end` when none does before it). `last` when that cannot be
        worked out. `crossings` keeps the lease's crossing steps by what they depend on: the
        same idle stretch and the same warning are asked about step after step."""
        if self._compares is None:
            return last
        read = _reading_changes(traces, grid, last, self.policy.timing.stale_after)
        if read is None:
            return last
        changes, idle_since = read
        moments = [*changes, *state.keys]
        granted = life.granted_at
        for since in idle_since:  # when the GPU counts as idle one by one
            moments += _crossing(crossings, grid, granted, since, self._threshold, op=">=")
        for fact, literal, op in self._idle if idle_since else ():
            value = _number(facts, fact, literal)
            if value is None:
                continue
            for since in idle_since:
                moments += _crossing(crossings, grid, granted, since, value, op=op)
        anchors = {"granted": granted, "expires": life.expires_at, **state.delivered}
        for anchor_name, sign, fact, literal in self._clock:
            value, anchor = _number(facts, fact, literal), anchors.get(anchor_name)
            if value is None or anchor is None:
                continue
            key = (anchor, sign, value)
            found = crossings.get(key)
            if found is None:
                crossed = anchor + sign * timedelta(minutes=value)
                found = crossings[key] = [grid.at_or_after(crossed), grid.after(crossed)]
            moments += found
        return min(filter(last.__lt__, moments), default=end)


def _number(facts: dict[str, Any], fact: str | None, literal: float | None) -> float | None:
    """What a moving fact is compared with, when it is a number (None: never crossed)."""
    if fact is None:
        return literal  # a number: others were left out once
    value = facts[fact]
    if type(value) is float:  # most: minutes
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _crossing(
    crossings: dict[tuple[Any, ...], list[datetime]],
    grid: _Grid,
    granted: datetime,
    since: datetime,
    value: float,
    *,
    op: str,
) -> list[datetime]:
    """`_idle_crossings`, kept in `crossings`."""
    key = (since, value, op)
    found = crossings.get(key)
    if found is None:
        found = crossings[key] = _idle_crossings(grid, granted, since, value, op)
    return found


def _reading_changes(
    traces: Sequence[GpuTrace | None], grid: _Grid, last: datetime, stale: timedelta
) -> tuple[list[datetime], list[datetime]] | None:
    """The steps where a GPU's reading stops being as it was at `last` (an idle one's
    minutes adding up aside), and since when each idle one has been idle. None: some reading
    may change with the next minute (it is about to go stale)."""
    moments, idle_since = [], []
    for trace in traces:
        if trace is None:
            continue
        found = trace.ahead(last, stale)
        if found is None:
            return None
        since, steady = found
        if since is not None:
            idle_since.append(since)
        moments.append(grid.at_or_after(steady))
    return moments, idle_since


def _idle_crossings(
    grid: _Grid, granted: datetime, since: datetime, value: float, op: str
) -> list[datetime]:
    """The steps where `idle time op value` may change, the idle time being the whole minutes
    since `since`, and no more than the lease's age when the GPU was idle before the grant."""
    whole = []
    if op in (">=", "<", "==", "!="):  # true from `value` minutes on
        whole.append(since + math.ceil(value) * MINUTE)
    if op in (">", "<=", "==", "!="):  # true from a whole minute past `value`
        whole.append(since + (math.floor(value) + 1) * MINUTE)
    moments = [grid.at_or_after(t) for t in whole]
    if since < granted:  # the age caps it
        age = granted + timedelta(minutes=value)
        moments += [grid.at_or_after(age), grid.after(age)]
    return moments


@dataclass(frozen=True)
class _Grid:
    """The steps: every `step` from `base`."""

    base: datetime
    step: timedelta

    def after(self, t: datetime) -> datetime:
        return self.base + ((t - self.base) // self.step + 1) * self.step

    def at_or_after(self, t: datetime) -> datetime:
        if t <= self.base:
            return self.base
        return self.base + -((self.base - t) // self.step) * self.step


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
    """`SweepReplay(policy, engine, step).events(...)` for one lease."""
    return SweepReplay(policy, engine, step).events(life, traces, since=since, until=until)


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


def _apply(
    policy: Policy,
    state: _State,
    lease: LeaseSnapshot,
    decision: Decision,
    warned: Warned,
    *,
    now: datetime,
) -> bool:
    """Carry out one evaluation's steps on the replayed state; True once it reclaims."""
    steps = lease_steps(lease, decision, warned, policy, now, paused=policy.automation_paused)
    for step in steps:
        if step.do == Do.FORGET:
            state.marks = state.marks.without(step.why)
            state.delivered.pop(step.why, None)
            continue
        if step.do not in (Do.WARN, Do.RECLAIM, Do.SHRINK, Do.NOTIFY) or step.match is None:
            continue  # would-haves and held-back reclaims change nothing
        event = SweepEvent(str(step.do), str(step.reason), now, step.match.rule)
        state.events.setdefault(event.key, event)
        if step.do == Do.WARN:
            _warn(policy, state, lease, str(step.reason), decision, now=now)
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
    again = reason == "expiry" and decision.facts["lease.expiry_warning_due"]
    if state.marks.warned(reason) and not again:
        return
    stage = expiry_stage(policy, lease, now) if reason == "expiry" else None
    state.marks = state.marks.with_warning(reason, outbox=None, owed_at=now, lead_min=stage or 0.0)
    state.delivered[reason] = now
    state.keys += [now + policy.timing.grace, now + policy.recall.notice]
