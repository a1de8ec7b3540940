"""The approval clock: when a waiting request is reminded about, escalated or expires, with
working hours (and their DST changes) stopping the reminder and escalation clocks; and the
`approvals:` settings as the rule files give them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, time, timedelta

import pytest

from rules.approval_clock import (
    Step,
    StepKind,
    Waiting,
    in_hours,
    next_step,
    tell_at,
    working_add,
    working_between,
)
from rules.errors import PolicyError
from rules.loader import load_policy
from rules.policy import Approvals, WorkingHours
from tests.builders import default_sources

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)  # a Monday, 11:00 in Berlin
M = timedelta(minutes=1)
H = timedelta(hours=1)
SETTINGS = Approvals()
BERLIN = WorkingHours(frozenset(range(5)), time(9), time(18), "Europe/Berlin")


@pytest.mark.parametrize(
    ("waiting", "now", "expected"),
    [
        (Waiting(T0), T0, Step(StepKind.REMIND, T0 + 30 * M)),
        (Waiting(T0), T0 + 29 * M, Step(StepKind.REMIND, T0 + 30 * M)),
        (Waiting(T0), T0 + 30 * M, Step(StepKind.REMIND, T0 + 30 * M)),
        # a late sweep sends one reminder, not every one it missed
        (Waiting(T0), T0 + 3 * H, Step(StepKind.REMIND, T0 + 30 * M)),
        (Waiting(T0, 1, T0 + 30 * M), T0 + H, Step(StepKind.REMIND, T0 + 150 * M)),
        (Waiting(T0, 1, T0 + 3 * H), T0 + 4 * H, Step(StepKind.ESCALATE, T0 + 4 * H)),
        (Waiting(T0, 2, T0 + 3 * H, escalated=True), T0 + 4 * H, Step(StepKind.REMIND, T0 + 5 * H)),
        (
            Waiting(T0, 3, T0 + 5 * H, escalated=True),
            T0 + 6 * H,
            Step(StepKind.EXPIRE, T0 + 24 * H),
        ),
        (Waiting(T0, 1, T0 + H), T0 + 24 * H, Step(StepKind.EXPIRE, T0 + 24 * H)),
    ],
)
def test_the_next_step_without_working_hours(
    waiting: Waiting, now: datetime, expected: Step
) -> None:
    assert expected == next_step(waiting, now, SETTINGS)


def test_escalation_set_to_never_only_reminds_then_expires() -> None:
    settings = replace(SETTINGS, escalate_after=None, max_reminders=1)
    assert StepKind.REMIND == next_step(Waiting(T0), T0 + H, settings).kind
    after = next_step(Waiting(T0, 1, T0 + H), T0 + 5 * H, settings)
    assert Step(StepKind.EXPIRE, T0 + 24 * H) == after
    assert not after.due(T0 + 5 * H)


@pytest.mark.parametrize(
    ("start", "amount", "expected"),
    [
        # Monday 11:00 Berlin (10:00 UTC) + 30m: the same morning
        (T0, 30 * M, T0 + 30 * M),
        # Monday 17:45 Berlin + 30m: 15 minutes on Tuesday from 09:00
        (datetime(2026, 3, 2, 16, 45, tzinfo=UTC), 30 * M, datetime(2026, 3, 3, 8, 15, tzinfo=UTC)),
        # Friday 17:30 Berlin + 4h: 3.5 h on Monday
        (datetime(2026, 3, 6, 16, 30, tzinfo=UTC), 4 * H, datetime(2026, 3, 9, 11, 30, tzinfo=UTC)),
        # Saturday night: the clock starts on Monday at 09:00
        (datetime(2026, 3, 7, 22, 0, tzinfo=UTC), 30 * M, datetime(2026, 3, 9, 8, 30, tzinfo=UTC)),
        # the Monday after the spring change: 09:00 Berlin is 07:00 UTC
        (
            datetime(2026, 3, 28, 12, 0, tzinfo=UTC),
            30 * M,
            datetime(2026, 3, 30, 7, 30, tzinfo=UTC),
        ),
        # Friday before the autumn change 17:00 CEST + 2h: Monday 10:00 CET is 09:00 UTC
        (
            datetime(2026, 10, 23, 15, 0, tzinfo=UTC),
            2 * H,
            datetime(2026, 10, 26, 9, 0, tzinfo=UTC),
        ),
    ],
)
def test_working_time_stops_outside_working_hours(
    start: datetime, amount: timedelta, expected: datetime
) -> None:
    assert expected == working_add(start, amount, BERLIN)
    assert amount == working_between(start, expected, BERLIN)


def test_a_request_filed_on_friday_evening_is_reminded_on_monday_morning() -> None:
    settings = replace(SETTINGS, working_hours=BERLIN)
    friday_evening = datetime(2026, 3, 6, 19, 0, tzinfo=UTC)  # 20:00 Berlin
    step = next_step(Waiting(friday_evening), friday_evening + 36 * H, settings)
    assert Step(StepKind.REMIND, datetime(2026, 3, 9, 8, 30, tzinfo=UTC)) == step
    assert not step.due(friday_evening + 36 * H)
    # expiry counts working time too: 24 working hours from Monday 09:00 is Wednesday 15:00
    later = next_step(Waiting(friday_evening, 3, friday_evening, True), friday_evening, settings)
    assert Step(StepKind.EXPIRE, datetime(2026, 3, 11, 14, 0, tzinfo=UTC)) == later


@pytest.mark.parametrize(
    ("at", "inside"),
    [
        (T0, True),
        (datetime(2026, 3, 2, 7, 59, tzinfo=UTC), False),  # 08:59 Berlin
        (datetime(2026, 3, 2, 17, 0, tzinfo=UTC), False),  # 18:00 Berlin
        (datetime(2026, 3, 7, 10, 0, tzinfo=UTC), False),  # Saturday
        (datetime(2026, 3, 30, 7, 0, tzinfo=UTC), True),  # 09:00 CEST
    ],
)
def test_in_hours(at: datetime, inside: bool) -> None:
    assert inside == in_hours(at, BERLIN)
    assert in_hours(at, None)


def test_the_shipped_settings_are_the_documented_defaults() -> None:
    policy = load_policy(default_sources())
    assert Approvals() == policy.approvals
    assert policy.approvals == policy.approvals_for("vision")


def test_a_team_overrides_some_keys_and_keeps_the_rest() -> None:
    sources = default_sources()
    sources["org.yaml"] = sources["org.yaml"].replace(
        "    approval: {channel: C0VAPPROV}   # cards go to this channel",
        "    approval: {channel: C0VAPPROV}\n    approvals:\n      escalate_after: never\n"
        "      escalate_to: [U0ADMIN01, C0ESCAL01]\n"
        '      working_hours: {days: mon-fri, from: "09:00", to: "18:00", tz: Europe/Berlin}\n',
    )
    policy = load_policy(sources)
    vision = policy.approvals_for("vision")
    assert vision.escalate_after is None
    assert ("U0ADMIN01", "C0ESCAL01") == vision.escalate_to
    assert BERLIN == vision.working_hours
    assert policy.approvals.remind_after == vision.remind_after
    assert Approvals() == policy.approvals_for("nlp")


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ("remind_every_x: 1h", "remind_every_x"),
        ("max_reminders: many", "max_reminders"),
        ("escalate_to: [bob]", "expected admins, a Slack user id (U…) or a channel id (C…)"),
        ("working_hours: {tz: Mars/Olympus}", "unknown time zone"),
        ('working_hours: {from: "18:00", to: "09:00"}', "must end after they start"),
        ("working_hours: {days: funday}", "expected days like mon-fri"),
        ("nag_every: 1h", "nag_every"),
    ],
)
def test_bad_approval_settings_are_refused_with_their_line(setting: str, problem: str) -> None:
    sources = default_sources()
    key = setting.split(":", maxsplit=1)[0]
    lines = sources["limits.yaml"].splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  expire_after:"))
    same = [i for i, line in enumerate(lines) if line.startswith(f"  {key}:")]
    if same:  # a key the section sets already: its value replaced
        lines[same[0]] = f"  {setting}"
    else:
        lines.insert(at, f"  {setting}")
    sources["limits.yaml"] = "\n".join(lines) + "\n"
    with pytest.raises(PolicyError) as caught:
        load_policy(sources)
    found = [str(p) for p in caught.value.problems]
    assert any(problem in p and p.startswith("limits.yaml:") for p in found), found
    assert not any("duplicate" in p for p in found), found


def test_an_extension_is_escalated_when_its_answer_would_come_too_late() -> None:
    """The deadline (the lease's last expiry warning) brings escalation forward, even outside
    working hours; once escalated it changes nothing."""
    deadline = T0 + 50 * M
    settings = replace(SETTINGS, working_hours=BERLIN)
    assert Step(StepKind.ESCALATE, deadline) == next_step(
        Waiting(T0), T0 + 50 * M, settings, deadline=deadline
    )
    assert StepKind.REMIND == next_step(Waiting(T0), T0 + 49 * M, settings, deadline=deadline).kind
    done = Waiting(T0, 1, T0 + 30 * M, escalated=True)
    assert StepKind.REMIND == next_step(done, T0 + 51 * M, SETTINGS, deadline=deadline).kind


@pytest.mark.parametrize(
    ("filed", "expected"),
    [
        (T0, T0 + 60 * M),  # before the first warning: told with it
        (T0 + 61 * M, T0 + 110 * M),  # after it (Extend on the warning): told with the last
        (T0 + 111 * M, None),  # after the last: the answer to the request said it
    ],
)
def test_a_pending_extension_is_told_at_the_first_warning_after_it(
    filed: datetime, expected: datetime | None
) -> None:
    leads = (60 * M, 10 * M)
    assert expected == tell_at(filed, T0 + 120 * M, leads)
