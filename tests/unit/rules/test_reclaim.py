"""The reclaim guard and the sweep's steps for a lease, as tables: the invariants hold whatever
the rules ask for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rules.decision import Decision, Match
from rules.domain import Action, Reason, Subject
from rules.lease_facts import LeaseSnapshot, Warned
from rules.marks import Marks
from rules.policy import Verdict
from rules.reclaim import Do, Step, lease_steps, may_reclaim
from tests.builders import default_policy

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GRACE = default_policy().timing.grace  # 30m in the shipped rules
NOTICE = default_policy().recall.notice  # 30m in the shipped rules


def a_lease(*, expires_in: timedelta = -timedelta(hours=1), **warnings: Any) -> LeaseSnapshot:
    return LeaseSnapshot(
        id=7,
        holder="U0ALICE01",
        team="vision",
        pool="a100",
        gpus=2,
        priority="normal",
        protected=False,
        granted_at=NOW - timedelta(hours=6),
        expires_at=NOW + expires_in,
        warnings=Marks(warnings),
        snoozed_until=None,
        slots=(("a100-node-01", 0), ("a100-node-01", 1)),
    )


def facts(**overrides: Any) -> dict[str, Any]:
    base = {
        "lease.protected": False,
        "telemetry.fresh": True,
        "lease.recalled": True,
        "lease.idle": True,
        "lease.unhealthy": False,
    }
    return {**base, **{k.replace("__", "."): v for k, v in overrides.items()}}


def delivered(reason: str, ago: timedelta) -> Warned:
    return Warned({reason: NOW - ago})


def refusal(
    reason: Reason,
    fact: dict[str, Any],
    warned: Warned,
    *,
    expires_in: timedelta = -timedelta(hours=1),
) -> str | None:
    lease = a_lease(expires_in=expires_in)
    return may_reclaim(lease, reason, fact, warned, policy=default_policy(), now=NOW)


LONG_AGO = timedelta(hours=2)
ALL_DELIVERED = Warned(dict.fromkeys(("expiry", "idle", "unhealthy", "preempt"), NOW - LONG_AGO))


@pytest.mark.parametrize(
    ("case", "reason", "fact", "warned", "expected"),
    [
        # invariant 4: protected leases are never reclaimed, for any reason
        ("protected, expired", Reason.EXPIRED, facts(lease__protected=True), ALL_DELIVERED,
         "protected leases are never reclaimed automatically"),
        ("protected, idle", Reason.IDLE, facts(lease__protected=True), ALL_DELIVERED,
         "protected leases are never reclaimed automatically"),
        ("protected, unhealthy", Reason.UNHEALTHY, facts(lease__protected=True), ALL_DELIVERED,
         "protected leases are never reclaimed automatically"),
        ("protected, preempted", Reason.PREEMPTED, facts(lease__protected=True), ALL_DELIVERED,
         "protected leases are never reclaimed automatically"),
        # invariant 3: unknown telemetry is never idle
        ("stale telemetry, idle", Reason.IDLE, facts(telemetry__fresh=False), ALL_DELIVERED,
         "telemetry is not fresh, so idleness is unknown"),
        # invariant 2: a delivered warning for that very reason
        ("expired, never warned", Reason.EXPIRED, facts(), Warned(),
         "no delivered expiry warning yet"),
        ("expired, undelivered warning", Reason.EXPIRED, facts(), Warned({"expiry": None}),
         "no delivered expiry warning yet"),
        ("expired, only idle warned", Reason.EXPIRED, facts(), delivered("idle", LONG_AGO),
         "no delivered expiry warning yet"),
        ("idle, only expiry warned", Reason.IDLE, facts(), delivered("expiry", LONG_AGO),
         "no delivered idle warning yet"),
        ("unhealthy, never warned", Reason.UNHEALTHY, facts(), Warned(),
         "no delivered unhealthy warning yet"),
        ("preempted, never warned", Reason.PREEMPTED, facts(), Warned(),
         "no delivered preempt warning yet"),
        ("a reason no warning stands for", Reason.UNRESERVED, facts(), ALL_DELIVERED,
         "no delivered None warning yet"),
        # invariant 2: the grace period (a preemption: the recall's notice) since delivery
        ("idle, inside grace", Reason.IDLE, facts(),
         delivered("idle", GRACE - timedelta(seconds=1)),
         f"grace runs until {(NOW + timedelta(seconds=1)).isoformat()}"),
        ("preempted, inside notice", Reason.PREEMPTED, facts(),
         delivered("preempt", NOTICE - timedelta(minutes=1)),
         f"notice runs until {(NOW + timedelta(minutes=1)).isoformat()}"),
        # a recall withdrawn since the warning takes nobody's GPUs
        ("preempted, recall withdrawn", Reason.PREEMPTED, facts(lease__recalled=False),
         ALL_DELIVERED, "the recall was withdrawn"),
        # the guard lets through what the invariants allow
        ("expired, grace over", Reason.EXPIRED, facts(), delivered("expiry", GRACE), None),
        ("idle, grace over", Reason.IDLE, facts(), delivered("idle", GRACE), None),
        ("unhealthy, grace over", Reason.UNHEALTHY, facts(), delivered("unhealthy", GRACE), None),
        ("preempted, notice over", Reason.PREEMPTED, facts(), delivered("preempt", NOTICE), None),
        ("unhealthy on stale telemetry", Reason.UNHEALTHY, facts(telemetry__fresh=False),
         ALL_DELIVERED, None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_the_reclaim_guard(
    case: str, reason: Reason, fact: dict[str, Any], warned: Warned, expected: str | None
) -> None:
    """Each invariant refuses a reclaim the rules ask for, whatever they say."""
    assert expected == refusal(reason, fact, warned), case


def test_an_expiry_reclaim_waits_for_the_expiry_itself() -> None:
    """A lease that has not expired is not reclaimed as expired, even when warned long ago."""
    ahead = timedelta(minutes=5)
    assert "not expired" == refusal(Reason.EXPIRED, facts(), ALL_DELIVERED, expires_in=ahead)


# ---- the steps for one lease --------------------------------------------------------------


def match(rule: str, action: Action, reason: Reason, *, observe: bool = False) -> Match:
    return Match(rule, Verdict(action=action, reason=reason), f"{rule} because", observe)


def decision(*matches: Match, **fact: Any) -> Decision:
    return Decision(
        subject=Subject.LEASE,
        revision="r1",
        engine="python",
        facts=facts(**fact),
        matches=matches,
        deciding=matches[0].rule if matches else "default",
        verdict=None,
        actions=tuple(m for m in matches if not m.observe),
    )


WARN_EXPIRY = match("warn-expiry", Action.WARN, Reason.EXPIRY)
WARN_IDLE = match("warn-idle", Action.WARN, Reason.IDLE)
RECLAIM_EXPIRED = match("reclaim-expired", Action.RECLAIM, Reason.EXPIRED)
RECLAIM_IDLE = match("reclaim-idle", Action.RECLAIM, Reason.IDLE)
NOTIFY = match("tell-admins", Action.NOTIFY, Reason.ADMINS)
OBSERVED = match("try-reclaim", Action.RECLAIM, Reason.IDLE, observe=True)


@pytest.mark.parametrize(
    ("case", "matches", "warned", "paused", "marks", "expected"),
    [
        ("nothing matched", (), Warned(), False, {}, []),
        ("a warning", (WARN_EXPIRY,), Warned(), False, {}, [(Do.WARN, "warn-expiry")]),
        ("a notice", (NOTIFY,), Warned(), False, {}, [(Do.NOTIFY, "tell-admins")]),
        # invariant 5: paused, every action is only recorded as a would-have
        ("paused", (WARN_EXPIRY, RECLAIM_EXPIRED, NOTIFY), ALL_DELIVERED, True, {},
         [(Do.WOULD_HAVE, "reclaim-expired"), (Do.WOULD_HAVE, "warn-expiry"),
          (Do.WOULD_HAVE, "tell-admins")]),
        # observe mode: recorded, never acted on, paused or not
        ("observe", (OBSERVED,), ALL_DELIVERED, False, {}, [(Do.WOULD_HAVE, "try-reclaim")]),
        # a reclaim comes first and ends the lease's steps
        ("reclaim first, then nothing", (WARN_IDLE, RECLAIM_EXPIRED, NOTIFY), ALL_DELIVERED,
         False, {"idle": {}}, [(Do.RECLAIM, "reclaim-expired")]),
        # a reclaim the guard refuses is held back, and the other actions still happen
        ("held back", (WARN_IDLE, RECLAIM_EXPIRED), Warned(), False, {},
         [(Do.HOLD_BACK, "reclaim-expired"), (Do.WARN, "warn-idle")]),
        ("two reclaims, the first held back", (RECLAIM_EXPIRED, RECLAIM_IDLE),
         delivered("idle", LONG_AGO), False, {},
         [(Do.HOLD_BACK, "reclaim-expired"), (Do.RECLAIM, "reclaim-idle")]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_the_steps_for_a_lease(
    case: str,
    *,
    matches: tuple[Match, ...],
    warned: Warned,
    paused: bool,
    marks: dict[str, Any],
    expected: list[tuple[Do, str]],
) -> None:
    """What the sweep does with a decision, in order."""
    steps = lease_steps(
        a_lease(**marks), decision(*matches), warned, default_policy(), NOW, paused=paused
    )
    assert expected == [(s.do, s.match.rule if s.match else s.why) for s in steps], case


def test_a_paused_or_observed_step_says_why() -> None:
    """A would-have records whether a pause or observe mode held it."""
    steps = lease_steps(
        a_lease(), decision(OBSERVED, WARN_IDLE), Warned(), default_policy(), NOW, paused=True
    )
    assert ["observe", "paused"] == [s.why for s in steps]


def test_a_held_back_reclaim_carries_the_guards_reason() -> None:
    """What the guard said is what the sweep reports."""
    steps = lease_steps(
        a_lease(), decision(RECLAIM_EXPIRED), Warned(), default_policy(), NOW, paused=False
    )
    assert [Step(Do.HOLD_BACK, RECLAIM_EXPIRED, "no delivered expiry warning yet")] == steps


@pytest.mark.parametrize(
    ("case", "marks", "fact", "expected"),
    [
        ("busy again: the idle warning goes", {"idle": {}}, facts(lease__idle=False), ["idle"]),
        ("still idle: it stays", {"idle": {}}, facts(lease__idle=True), []),
        ("healthy again: the unhealthy warning goes", {"unhealthy": {}},
         facts(lease__unhealthy=False), ["unhealthy"]),
        ("still unhealthy: it stays", {"unhealthy": {}}, facts(lease__unhealthy=True), []),
        ("both go", {"idle": {}, "unhealthy": {}}, facts(lease__idle=False), ["idle", "unhealthy"]),
        ("an expiry warning is never forgotten", {"expiry": {}}, facts(lease__idle=False), []),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_warnings_that_no_longer_stand_are_forgotten(
    case: str, marks: dict[str, Any], fact: dict[str, Any], expected: list[str]
) -> None:
    """An idle or unhealthy warning the facts no longer bear out is dropped."""
    d = Decision(Subject.LEASE, "r1", "python", fact, (), "default", None)
    steps = lease_steps(a_lease(**marks), d, Warned(), default_policy(), NOW, paused=False)
    assert expected == [s.why for s in steps if s.do == Do.FORGET], case
