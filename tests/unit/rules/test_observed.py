"""What came of a would-have reclaim, and the false-positive line: table tests, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rules.observed import After, Afterwards, Tally, after, false_positive_line

AT = datetime(2026, 3, 2, 9, 31, tzinfo=UTC)
HOUR = timedelta(hours=1)
LATER = AT + 2 * HOUR


@pytest.mark.parametrize(
    ("facts", "until", "expected"),
    [
        (Afterwards(1, 3, 60, None), LATER, After.BUSY),
        (Afterwards(1, 3, 60, None), AT + timedelta(minutes=5), After.BUSY),  # busy decides
        (Afterwards(0, 60, 60, None), LATER, After.IDLE),
        (Afterwards(0, 70, 60, None), LATER, After.IDLE),
        (Afterwards(0, 59, 60, None), LATER, After.UNKNOWN),  # a gap is never idle
        (Afterwards(0, 0, 60, None), LATER, After.UNKNOWN),
        (Afterwards(0, 0, 20, AT + timedelta(minutes=20)), LATER, After.IDLE),  # ended early
        (Afterwards(0, 0, 20, AT + timedelta(minutes=20)), AT + timedelta(minutes=30), After.IDLE),
        (Afterwards(0, 60, 60, AT + HOUR), LATER, After.IDLE),  # held to the end of the hour
        (Afterwards(0, 30, 30, None), AT + timedelta(minutes=30), After.PENDING),
    ],
)
def test_what_came_of_a_would_have_reclaim(
    facts: Afterwards, until: datetime, expected: After
) -> None:
    assert expected == after(facts, AT, HOUR, until)


@pytest.mark.parametrize(
    ("tally", "line"),
    [
        (Tally(busy=3, idle=9), "busy again within 1h after 3 of 12 would-have reclaims (25 %)"),
        (Tally(busy=1), "busy again within 1h after 1 of 1 would-have reclaim (100 %)"),
        (
            Tally(busy=1, idle=1, unknown=2, pending=1),
            "busy again within 1h after 1 of 2 would-have reclaims (50 %); 2 left out: no "
            "telemetry for part of the 1h after; 1 too recent to tell",
        ),
        (Tally(unknown=1), "no would-have reclaim could be checked against 1h after it; "
         "1 left out: no telemetry for part of the 1h after"),
    ],
)  # fmt: skip
def test_the_false_positive_line(tally: Tally, line: str) -> None:
    assert line == false_positive_line(tally, HOUR)


def test_the_rate_leaves_unknown_and_too_recent_out() -> None:
    tally = Tally().add(After.BUSY).add(After.IDLE).add(After.IDLE).add(After.UNKNOWN)
    assert (4, 3) == (tally.total, tally.decided)
    assert tally.false_positive_rate == pytest.approx(1 / 3)
    assert Tally().false_positive_rate is None
