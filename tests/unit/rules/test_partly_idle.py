"""Idle judged per GPU, the `shrink idle` guard and which GPUs a shrink gives back, as tables:
unknown telemetry is never idle (nor busy), and a shrink holds reclaim's invariants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rules.decision import Decision, Match
from rules.domain import Action, Reason, Subject
from rules.lease_facts import LeaseSnapshot, Reading, Warned, lease_facts
from rules.marks import Marks
from rules.policy import Verdict
from rules.reclaim import Do, lease_steps, may_shrink, to_shrink
from rules.shrinking import Problem, Slot, to_give_back
from tests.builders import Seen, default_policy

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GRACE = default_policy().timing.grace
THRESHOLD = default_policy().timing.idle_threshold
NODE = "a100-node-01"


IDLE = Seen()
BUSY = Seen(util_pct=90.0, idle_for=timedelta(0))
STALE = Seen(fresh=False)  # a stale minute: idle_for says 2h, but nobody can vouch for it
NOT_YET = Seen(idle_for=THRESHOLD - timedelta(minutes=1))


def a_lease(
    gpus: int = 4, *, age: timedelta = timedelta(hours=3), marks: Marks | None = None
) -> LeaseSnapshot:
    return LeaseSnapshot(
        id=7,
        holder="U0ALICE01",
        team="vision",
        pool="a100",
        gpus=gpus,
        priority="normal",
        protected=False,
        granted_at=NOW - age,
        expires_at=NOW + timedelta(hours=3),
        warnings=marks or Marks(),
        snoozed_until=None,
        slots=tuple((NODE, i) for i in range(gpus)),
    )


@pytest.mark.parametrize(
    ("case", "readings", "age", "idle", "busy", "partly", "idle_for"),
    [
        ("3 idle, 1 busy", [IDLE, IDLE, IDLE, BUSY], timedelta(hours=3), 3, 1, True, 120.0),
        ("all idle is not partly idle", [IDLE] * 4, timedelta(hours=3), 4, 0, False, 120.0),
        ("all busy", [BUSY] * 4, timedelta(hours=3), 0, 4, False, 0.0),
        ("a stale minute is never idle", [STALE, STALE, STALE, BUSY], timedelta(hours=3),
         0, 1, False, 0.0),
        ("a stale GPU is neither", [IDLE, STALE, IDLE, BUSY], timedelta(hours=3), 2, 1, True,
         120.0),
        ("a GPU never read is neither", [IDLE, None, None, BUSY], timedelta(hours=3), 1, 1,
         True, 120.0),
        ("idle, not yet for the threshold, is busy", [IDLE, NOT_YET, IDLE, BUSY],
         timedelta(hours=3), 2, 2, True, 120.0),
        ("idle before the lease began does not count", [IDLE, IDLE, IDLE, BUSY],
         THRESHOLD - timedelta(minutes=1), 0, 4, False, 0.0),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_idle_is_judged_per_gpu(
    case: str,
    *,
    readings: list[Reading | None],
    age: timedelta,
    idle: int,
    busy: int,
    partly: bool,
    idle_for: float,
) -> None:
    """Each GPU is idle, busy or unknown, judged as lease idleness is."""
    facts = lease_facts(default_policy(), a_lease(age=age), readings, Warned(), NOW)
    got = (
        facts["lease.idle_gpus"],
        facts["lease.busy_gpus"],
        facts["lease.partly_idle"],
        facts["lease.idle_gpus_for"],
    )
    assert (idle, busy, partly, idle_for) == got, case


def test_keep_and_a_delivered_partly_idle_warning_are_facts() -> None:
    """`lease.kept` and the partly-idle warning's delivery reach the rules."""
    lease = a_lease(marks=Marks().with_kept(at=NOW))
    warned = Warned({"partly_idle": NOW - timedelta(minutes=40)})
    facts = lease_facts(default_policy(), lease, [IDLE, BUSY, BUSY, BUSY], warned, NOW)
    assert (True, True, 40.0) == (
        facts["lease.kept"],
        facts["lease.warned.partly_idle"],
        facts["lease.since_warned.partly_idle"],
    )


def shrink_facts(**overrides: Any) -> dict[str, Any]:
    base = {
        "lease.protected": False,
        "telemetry.fresh": True,
        "lease.kept": False,
        "lease.idle_gpus": 3,
        "lease.busy_gpus": 1,
        "lease.partly_idle": True,
        "lease.idle": False,
        "lease.unhealthy": False,
    }
    return {**base, **{k.replace("__", "."): v for k, v in overrides.items()}}


LONG_AGO = Warned({"partly_idle": NOW - 2 * GRACE})


@pytest.mark.parametrize(
    ("case", "facts", "warned", "expected"),
    [
        ("allowed", shrink_facts(), LONG_AGO, None),
        ("protected", shrink_facts(lease__protected=True), LONG_AGO,
         "protected leases are never shrunk automatically"),
        ("stale telemetry", shrink_facts(telemetry__fresh=False), LONG_AGO,
         "telemetry is not fresh, so idleness is unknown"),
        ("kept", shrink_facts(lease__kept=True), LONG_AGO, "the holder chose to keep every GPU"),
        ("all idle", shrink_facts(lease__busy_gpus=0), LONG_AGO,
         "shrinking needs some GPUs idle and at least one busy"),
        ("never warned", shrink_facts(), Warned(), "no delivered partly_idle warning yet"),
        ("warned, not delivered", shrink_facts(), Warned({"partly_idle": None}),
         "no delivered partly_idle warning yet"),
        ("within the grace", shrink_facts(), Warned({"partly_idle": NOW - GRACE / 2}),
         f"grace runs until {(NOW + GRACE / 2).isoformat()}"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_shrink_idle_holds_the_reclaim_invariants(
    case: str, *, facts: dict[str, Any], warned: Warned, expected: str | None
) -> None:
    """Warned first, grace waited, fresh telemetry, never protected, never after Keep."""
    assert expected == may_shrink(facts, warned, policy=default_policy(), now=NOW), case


A, B, C, D = ((NODE, i) for i in range(4))


@pytest.mark.parametrize(
    ("case", "named", "idle", "held", "expected"),
    [
        ("the named idle GPUs", [C, D], [C, D], [A, B, C, D], (C, D)),
        ("idle since the warning, never named", [C, D], [B, C, D], [A, B, C, D], (C, D)),
        ("a named GPU busy again", [C, D], [D], [A, B, C, D], (D,)),
        ("a named GPU given back already", [C, D], [C, D], [A, B, D], (D,)),
        ("none of the named idle", [C, D], [B], [A, B, C, D], ()),
        ("no warning names any", [], [B, C], [A, B, C, D], ()),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_shrink_idle_gives_back_only_what_the_warning_named(
    case: str, named: list[Slot], idle: list[Slot], held: list[Slot], expected: tuple[Slot, ...]
) -> None:
    """Idle now, named by the delivered warning and still held; else nothing."""
    assert expected == to_shrink(named, idle, held), case


SHRINK_IDLE = Match(
    "shrink-partly-idle", Verdict(action=Action.SHRINK, reason=Reason.IDLE), "idle GPUs"
)


def a_decision(**overrides: Any) -> Decision:
    return Decision(
        subject=Subject.LEASE,
        revision="r1",
        engine="python",
        facts=shrink_facts(**overrides),
        matches=(SHRINK_IDLE,),
        deciding=SHRINK_IDLE.rule,
        verdict=None,
        actions=(SHRINK_IDLE,),
    )


@pytest.mark.parametrize(
    ("case", "warned", "paused", "expected"),
    [
        ("after the grace", LONG_AGO, False, Do.SHRINK),
        ("paused: only a would-have", LONG_AGO, True, Do.WOULD_HAVE),
        ("within the grace: held back", Warned({"partly_idle": NOW}), False, Do.HOLD_BACK),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_the_shrink_step_obeys_pause_and_grace(
    case: str, *, warned: Warned, paused: bool, expected: Do
) -> None:
    """The sweep shrinks only when the guard allows it and automation runs."""
    steps = lease_steps(a_lease(), a_decision(), warned, default_policy(), NOW, paused=paused)
    assert [expected] == [s.do for s in steps], case


def test_a_partly_idle_warning_that_no_longer_stands_is_forgotten() -> None:
    """All GPUs busy again: the warning mark goes, so a later idle spell warns afresh."""
    marks = Marks().with_warning("partly_idle", outbox=1, owed_at=NOW, lead_min=0.0)
    busy = Decision(
        subject=Subject.LEASE,
        revision="r1",
        engine="python",
        facts=shrink_facts(lease__partly_idle=False),
        matches=(),
        deciding="default",
        verdict=None,
        actions=(),
    )
    steps = lease_steps(a_lease(marks=marks), busy, Warned(), default_policy(), NOW, paused=False)
    assert [(Do.FORGET, "partly_idle")] == [(s.do, s.why) for s in steps]


HELD: list[Slot] = [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)]


@pytest.mark.parametrize(
    ("case", "named", "keep", "idle", "empty", "expected"),
    [
        ("named", [("n1", 2), ("n1", 3)], None, (), (), (("n1", 2), ("n1", 3))),
        ("named twice", [("n1", 2), ("n1", 2)], None, (), (), (("n1", 2),)),
        ("not held", [("n1", 7)], None, (), (),
         Problem("L7 does not hold n1:7; it holds n1:0, n1:1, n1:2, n1:3.", "not-held")),
        ("every GPU", HELD, None, (), (),
         Problem("That is every GPU of L7; `/gpu release L7` gives the whole lease back.", "all")),
        ("none named", [], None, (), (),
         Problem("Which GPUs? `/gpu release L7 gpus node:2,3`.", "no-gpus")),
        ("keep 1: highest first", [], 1, (), (), (("n1", 3), ("n1", 2), ("n1", 1))),
        ("keep 1: idle first", [], 1, {("n1", 0), ("n1", 1)}, {("n1", 3)},
         (("n1", 1), ("n1", 0), ("n1", 3))),
        ("keep 3: empty before busy", [], 3, (), {("n1", 1)}, (("n1", 1),)),
        ("keep 0", [], 0, (), (),
         Problem("Keeping no GPUs is a release: `/gpu release L7` gives the lease back.",
                 "keep-none")),
        ("keep all", [], 4, (), (),
         Problem("L7 holds 4 GPUs, so keeping 4 gives nothing back. Say fewer: "
                 "`/gpu release L7 keep 1`.", "keep-all")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_which_gpus_a_shrink_gives_back(
    case: str,
    *,
    named: list[Slot],
    keep: int | None,
    idle: Any,
    empty: Any,
    expected: tuple[Slot, ...] | Problem,
) -> None:
    """Named GPUs, or all but `keep`: idle ones first, then empty ones, highest index first."""
    got = to_give_back("L7", HELD, named=named, keep=keep, idle=idle, empty=empty)
    assert expected == got, case


def test_the_partly_idle_mark_names_its_gpus_and_keep_answers_it() -> None:
    """The warning's idle GPUs survive the JSON round trip; Keep drops the warning."""
    marks = Marks().with_warning("partly_idle", outbox=4, owed_at=NOW, lead_min=0.0)
    named = marks.with_idle_slots((("a100-node-01", 2), ("node:with:colons", 3)))
    assert (("a100-node-01", 2), ("node:with:colons", 3)) == Marks.of(named.to_json()).idle_slots()
    assert {"partly_idle": 4} == named.outboxes()
    kept = named.with_kept(at=NOW)
    assert (True, (), {}) == (kept.kept, kept.idle_slots(), kept.outboxes())
    assert not Marks().kept
