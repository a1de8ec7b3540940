"""A loaded policy: teams, pools, quotas, limits, timing, rules and their test cases.

Immutable values built by rules.loader; `revision` is the hash of the files they came from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import time, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any

from rules import expr
from rules.catalogue import CATALOGUE, FactType
from rules.domain import (
    ACTION_REASONS,
    Action,
    Outcome,
    Reason,
    Subject,
    format_duration,
    plural,
)

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
APPROVERS = ("managers", "admins")


@dataclass(frozen=True)
class WorkingHours:
    """When reminders and escalations go out and their clocks run (local wall time)."""

    days: frozenset[int]  # 0 is Monday
    start: time
    end: time
    tz: str


@dataclass(frozen=True)
class Approvals:
    """How a request waiting for a person is chased: reminders, escalation, expiry."""

    remind_after: timedelta = timedelta(minutes=30)
    remind_every: timedelta = timedelta(hours=2)
    max_reminders: int = 3
    escalate_after: timedelta | None = timedelta(hours=4)  # None: never
    escalate_to: tuple[str, ...] = ("admins",)  # "admins", user ids and/or a channel id
    expire_after: timedelta = timedelta(hours=24)
    working_hours: WorkingHours | None = None


@dataclass(frozen=True)
class Digest:
    """When a report digest goes out: `day` "daily" or mon..sun, at local wall time in `tz`;
    `channel` for the lab digest (None: each person's own, by DM)."""

    day: str
    at: time
    tz: str
    channel: str | None = None


@dataclass(frozen=True)
class Reports:
    """Usage reports: the currency of pool prices, how long hourly rows are kept, the window an
    observe-mode would-have reclaim is checked against, and the scheduled digests."""

    currency: str = "USD"
    keep_hourly: timedelta = timedelta(days=400)
    busy_again_within: timedelta = timedelta(hours=1)
    lab_digest: Digest | None = None
    personal_digests: Digest | None = None


@dataclass(frozen=True)
class Team:
    name: str
    managers: frozenset[str]
    members: frozenset[str]
    approval_channel: str | None  # None: the managers are asked by DM
    approvals: Approvals | None = None  # None: the lab-wide settings


@dataclass(frozen=True)
class Quota:
    nominal: int
    borrowing_limit: int
    lending_limit: int
    weight: float = 1.0  # fair share among borrowers: a team of weight 2 is owed twice the GPU-h


@dataclass(frozen=True)
class Limits:
    max_gpus_per_request: int
    max_duration: timedelta
    max_extensions: int
    max_extension_total: timedelta
    default_duration: timedelta
    max_queue_wait: timedelta


@dataclass(frozen=True)
class Timing:
    expiry_leads: tuple[timedelta, ...]  # longest first
    idle_threshold: timedelta
    grace: timedelta
    snooze: timedelta
    max_snoozes: int
    stale_after: timedelta


@dataclass(frozen=True)
class Recall:
    """Lender recall: how a team gets its nominal GPUs back from borrowers."""

    notice: timedelta = timedelta(minutes=30)  # after the delivered preemption warning
    min_runtime: timedelta = timedelta(hours=1)  # a younger lease is never recalled
    cooldown: timedelta = timedelta(days=1)  # nobody is preempted twice within this
    # ... unless a guarantee (in-nominal request) has waited this long: the cooldown yields
    max_guarantee_wait: timedelta = timedelta(minutes=30)


class Backfill(StrEnum):
    """Whether a queued request may start before an earlier one still waiting."""

    RESERVE = "reserve"  # only when it delays no earlier request's expected start (Slurm)
    BEST_EFFORT = "best_effort"  # whenever it fits (Kueue's BestEffortFIFO)
    NONE = "none"  # never: each pool's queue is served strictly in order


@dataclass(frozen=True)
class QueueRules:
    """How each pool's queue is served (see rules.queueing)."""

    backfill: Backfill = Backfill.RESERVE
    # past usage counts half after this when borrowers' heads are ordered; zero: no fair share
    fair_share_half_life: timedelta = timedelta(days=7)


@dataclass(frozen=True)
class Preemption:
    """Preemption within a team: `lower_priority` lets a team's waiting request recall the
    same team's lower-priority leases (with recall's notice and minimum runtime)."""

    within_team: str = "off"

    @property
    def by_priority(self) -> bool:
        return self.within_team == "lower_priority"


@dataclass(frozen=True)
class FleetLimits:
    """What the fleet's telemetry must show: a GPU is occupied by any process or by more memory
    than the floor; a device silent for longer than `not_reporting_after` is out of service."""

    memory_floor_mib: int = 256
    not_reporting_after: timedelta = timedelta(seconds=90)  # three polls of 30 s


@dataclass(frozen=True)
class Pool:
    name: str
    model: str
    protected: bool
    nodes: Mapping[str, int]
    quotas: Mapping[str, Quota]
    limits: Limits
    cost_per_gpu_hour: float | None = None  # in Reports.currency; None: not priced

    @property
    def size(self) -> int:
        return sum(self.nodes.values())


@dataclass(frozen=True)
class Verdict:
    """What one rule says: an outcome for requests, an action for sweeps."""

    outcome: Outcome | None = None
    approvers: str | None = None  # for ask: "managers" or "admins"
    action: Action | None = None
    reason: Reason | None = None

    def __str__(self) -> str:
        if self.outcome is not None:
            return f"ask {self.approvers}" if self.outcome == Outcome.ASK else self.outcome.value
        return f"{self.action} {self.reason}"


@dataclass(frozen=True)
class Rule:
    id: str
    subject: Subject
    when: str
    condition: expr.Node
    verdict: Verdict
    because: str
    observe: bool
    file: str
    line: int

    def explain(self, facts: Mapping[str, Any]) -> str:
        """The `because` text with fact values filled in."""
        return fill(self._parts, facts) if self.because else f"rule {self.id} matched"

    @cached_property
    def _parts(self) -> tuple[str, ...]:
        return _split(self.because)


@dataclass(frozen=True)
class Case:
    name: str
    subject: Subject
    facts: Mapping[str, Any]
    expect: tuple[str, ...]  # an outcome, or the sorted sweep actions ("warn expiry", ...)
    deciding: str | None
    file: str
    line: int


@dataclass(frozen=True)
class Policy:
    revision: str
    admins: frozenset[str]
    accounts: Mapping[str, str]
    teams: Mapping[str, Team]
    pools: Mapping[str, Pool]
    limits: Limits
    timing: Timing
    automation_paused: bool
    default: Verdict
    default_because: str
    rules: tuple[Rule, ...]
    cases: tuple[Case, ...]
    files: tuple[str, ...]
    recall: Recall = field(default_factory=Recall)
    queue: QueueRules = field(default_factory=QueueRules)
    preemption: Preemption = field(default_factory=Preemption)
    fleet: FleetLimits = field(default_factory=FleetLimits)
    approvals: Approvals = field(default_factory=Approvals)
    reports: Reports = field(default_factory=Reports)
    names: Mapping[str, str] = field(default_factory=dict)  # Slack id: how to show the person
    _team_of: Mapping[str, str] = field(default_factory=dict, repr=False)

    def rules_for(self, subject: Subject) -> tuple[Rule, ...]:
        return self._by_subject[subject]

    @cached_property
    def _by_subject(self) -> dict[Subject, tuple[Rule, ...]]:
        return {s: tuple(r for r in self.rules if r.subject == s) for s in Subject}

    def team_of(self, user: str) -> Team | None:
        name = self._team_of.get(user)
        return self.teams[name] if name else None

    def is_admin(self, user: str) -> bool:
        return user in self.admins

    def approvals_for(self, team: str) -> Approvals:
        """How the team's waiting requests are chased: its own settings, else the lab's."""
        found = self.teams.get(team)
        return found.approvals if found and found.approvals else self.approvals


def render(template: str, facts: Mapping[str, Any]) -> str:
    """Fill `{fact.name}` placeholders: durations as 6h, booleans as yes/no; `{fact.name|noun}`
    shows a count with its noun agreeing (1 process, 2 processes)."""
    return fill(_split(template), facts)


def _split(template: str) -> tuple[str, ...]:
    """Literal text at even positions, fact names at odd positions."""
    return tuple(p.strip() if i % 2 else p for i, p in enumerate(PLACEHOLDER.split(template)))


def fill(parts: tuple[str, ...], facts: Mapping[str, Any]) -> str:
    return "".join(_placed(part, facts) if i % 2 else part for i, part in enumerate(parts))


def placeholder_fact(part: str) -> str:
    """The fact a placeholder names: `gpu.processes` in `{gpu.processes|process}`."""
    return part.split("|", 1)[0].strip()


def _placed(part: str, facts: Mapping[str, Any]) -> str:
    name, _, noun = part.partition("|")
    value = facts.get(name.strip())
    if noun.strip() and isinstance(value, int | float) and float(value).is_integer():
        counted = plural(int(value), noun.strip())
        return "no" + counted[1:] if int(value) == 0 else counted
    return show(name.strip(), value)


def show(name: str, value: Any) -> str:
    """One fact value as a person reads it: durations as 6h, booleans as yes/no."""
    spec = _ANY_SPEC.get(name)
    if spec is not None and spec.type == FactType.DURATION and isinstance(value, int | float):
        return format_duration(timedelta(minutes=value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_ANY_SPEC = {name: spec for specs in CATALOGUE.values() for name, spec in specs.items()}


# ---- what `then` says -------------------------------------------------------------------


def parse_request_then(then: str) -> Verdict | None:
    words = then.split()
    if not words:
        return None
    try:
        outcome = Outcome(words[0])
    except ValueError:
        return None
    if outcome == Outcome.ASK:
        approvers = words[1] if len(words) == 2 else "managers"
        if len(words) > 2 or approvers not in APPROVERS:
            return None
        return Verdict(outcome=outcome, approvers=approvers)
    return Verdict(outcome=outcome) if len(words) == 1 else None


def parse_sweep_then(then: str) -> Verdict | None:
    words = then.split()
    if len(words) != 2:
        return None
    try:
        action, reason = Action(words[0]), Reason(words[1])
    except ValueError:
        return None
    if reason not in ACTION_REASONS[action]:
        return None
    return Verdict(action=action, reason=reason)


def then_help(subject: Subject, then: str) -> str:
    if subject == Subject.REQUEST:
        return (
            f"`then: {then}` is not a request outcome; expected approve, queue, deny, "
            "ask, ask managers or ask admins"
        )
    choices = "; ".join(
        f"{a} " + "|".join(sorted(r.value for r in reasons))
        for a, reasons in ACTION_REASONS.items()
    )
    return f"`then: {then}` is not a sweep action; expected one of: {choices}"
