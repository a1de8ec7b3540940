"""What the sweep does about one lease, and the reclaim guard that holds whatever the rules say.

The sweep rules say what they would like done; `lease_steps` turns their decision into the
steps the sweep carries out, in order, and `may_reclaim` refuses any reclaim the safety
invariants forbid: nothing is reclaimed without a delivered warning for that reason and the
grace period since its delivery (2); unknown telemetry is never idle (3); protected leases are
never reclaimed (4). A pause turns every action into a recorded "would have" (5). Pure: the
sweep passes `now` in and does every write itself. `may_shrink` holds the same invariants for
`shrink idle`, which gives back only a lease's idle GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from rules.decision import Decision, Match
from rules.domain import Action, Reason
from rules.lease_facts import LeaseSnapshot, Warned
from rules.policy import Policy

Slot = tuple[str, int]  # a GPU as (node, index)

#: The warning a reclaim needs, by the reclaim's reason.
WARNING_FOR = {
    Reason.EXPIRED: "expiry",
    Reason.IDLE: "idle",
    Reason.UNHEALTHY: "unhealthy",
    Reason.PREEMPTED: "preempt",
}


def may_reclaim(
    lease: LeaseSnapshot,
    reason: Reason,
    facts: Mapping[str, Any],
    warned: Warned,
    *,
    policy: Policy,
    now: datetime,
) -> str | None:
    """The invariants, checked in code whatever the rules say; a reason not to, or None."""
    if facts["lease.protected"]:
        return "protected leases are never reclaimed automatically"
    if reason == Reason.IDLE and not facts["telemetry.fresh"]:
        return "telemetry is not fresh, so idleness is unknown"
    if reason == Reason.EXPIRED and now < lease.expires_at:
        return "not expired"
    if reason == Reason.PREEMPTED and not facts["lease.recalled"]:
        return "the recall was withdrawn"
    warning = WARNING_FOR.get(reason)
    delivered = warned.at(warning) if warning else None
    if delivered is None:
        return f"no delivered {warning} warning yet"
    # A preemption gives the recall's notice period; every other reclaim the grace period.
    wait = policy.recall.notice if reason == Reason.PREEMPTED else policy.timing.grace
    if now - delivered < wait:
        kind = "notice" if reason == Reason.PREEMPTED else "grace"
        return f"{kind} runs until {(delivered + wait).isoformat()}"
    return None


def may_shrink(
    facts: Mapping[str, Any],
    warned: Warned,
    *,
    policy: Policy,
    now: datetime,
) -> str | None:
    """`shrink idle` under reclaim's invariants: a delivered partly-idle warning and the grace
    since it, fresh telemetry on every GPU, never a protected lease, never the holder's Keep;
    and it leaves a GPU (a lease idle on every GPU is a reclaim's business). None: go ahead."""
    if facts["lease.protected"]:
        return "protected leases are never shrunk automatically"
    if not facts["telemetry.fresh"]:
        return "telemetry is not fresh, so idleness is unknown"
    if facts["lease.kept"]:
        return "the holder chose to keep every GPU"
    if not facts["lease.idle_gpus"] or not facts["lease.busy_gpus"]:
        return "shrinking needs some GPUs idle and at least one busy"
    delivered = warned.at("partly_idle")
    if delivered is None:
        return "no delivered partly_idle warning yet"
    if now - delivered < policy.timing.grace:
        return f"grace runs until {(delivered + policy.timing.grace).isoformat()}"
    return None


def to_shrink(
    named: Sequence[Slot], idle: Sequence[Slot], held: Sequence[Slot]
) -> tuple[Slot, ...]:
    """The GPUs `shrink idle` gives back: idle now, named by the delivered partly-idle warning
    (nothing goes back unwarned), and still the lease's own. Empty: nothing to give back."""
    return tuple(slot for slot in named if slot in idle and slot in held)


class Do(StrEnum):
    """One kind of step the sweep takes about a lease."""

    WOULD_HAVE = "would_have"  # record what an action would have done (observe or paused)
    WARN = "warn"
    RECLAIM = "reclaim"
    SHRINK = "shrink"  # give back the lease's idle GPUs, keep the rest
    HOLD_BACK = "hold_back"  # a reclaim the invariants refuse
    NOTIFY = "notify"  # tell the admins, once
    FORGET = "forget"  # drop a warning that no longer stands


@dataclass(frozen=True)
class Step:
    """What to do, for which rule's action (`match`), and why.

    `why` is "observe" or "paused" for a would-have, the refusal for a held-back reclaim,
    and the lease mark to drop for a forget."""

    do: Do
    match: Match | None = None
    why: str = ""

    @property
    def reason(self) -> Reason:
        assert self.match is not None
        assert self.match.verdict.reason is not None
        return self.match.verdict.reason


def lease_steps(
    lease: LeaseSnapshot,
    decision: Decision,
    warned: Warned,
    policy: Policy,
    now: datetime,
    *,
    paused: bool,
) -> list[Step]:
    """The steps for one lease, in the order they are taken.

    Observe-only matches first; then the enforced actions, reclaims first (a lease reclaimed
    in this pass is warned of nothing any more, and nothing follows a reclaim); last, the
    idle and unhealthy warnings the facts no longer bear out are forgotten."""
    steps = [Step(Do.WOULD_HAVE, m, "observe") for m in decision.would_have]
    ordered = sorted(decision.actions, key=lambda m: m.verdict.action != Action.RECLAIM)
    for match in ordered:
        step = _step(lease, match, decision, warned, policy=policy, now=now, paused=paused)
        steps.append(step)
        if step.do == Do.RECLAIM:
            return steps
    steps += forget_steps(lease, decision.facts)
    return steps


# A warning stands while its fact holds: the mark, and the fact that bears it out.
_FORGETTABLE = (
    ("idle", "lease.idle"),
    ("partly_idle", "lease.partly_idle"),
    ("unhealthy", "lease.unhealthy"),
)


def forget_steps(lease: LeaseSnapshot, facts: Mapping[str, Any]) -> list[Step]:
    """The idle and unhealthy warnings the facts no longer bear out, to forget: every step
    of `lease_steps` for a lease no rule matched (most leases of a sweep)."""
    marks = lease.warnings
    if not marks.raw:  # no mark at all: nothing to forget
        return []
    return [
        Step(Do.FORGET, why=mark)
        for mark, fact in _FORGETTABLE
        if marks.has(mark) and not facts[fact]
    ]


def _step(
    lease: LeaseSnapshot,
    match: Match,
    decision: Decision,
    warned: Warned,
    *,
    policy: Policy,
    now: datetime,
    paused: bool,
) -> Step:
    """The step for one enforced action."""
    action, reason = match.verdict.action, match.verdict.reason
    assert action is not None
    assert reason is not None
    if paused:
        return Step(Do.WOULD_HAVE, match, "paused")
    if action == Action.WARN:
        return Step(Do.WARN, match)
    if action == Action.RECLAIM:
        refusal = may_reclaim(lease, reason, decision.facts, warned, policy=policy, now=now)
        return Step(Do.RECLAIM, match) if refusal is None else Step(Do.HOLD_BACK, match, refusal)
    if action == Action.SHRINK:
        refusal = may_shrink(decision.facts, warned, policy=policy, now=now)
        return Step(Do.SHRINK, match) if refusal is None else Step(Do.HOLD_BACK, match, refusal)
    return Step(Do.NOTIFY, match)
