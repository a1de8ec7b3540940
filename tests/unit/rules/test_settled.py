"""What became of a warning that no longer stands, decided from the lease as it stands."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rules.marks import Marks
from rules.settled import Settled, WarningShown, settled

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
OWED = NOW - timedelta(minutes=30)
END = OWED + timedelta(minutes=60)  # what the expiry warning said
EXPIRY = WarningShown(7, "expiry", OWED, time_left_min=60.0)
IDLE = WarningShown(8, "partly_idle", OWED, idle=("a:1", "a:2"))
HELD = ("a:0", "a:1", "a:2")


def _marks(**warnings: int) -> Marks:
    marks = Marks()
    for reason, outbox in warnings.items():
        marks = marks.with_warning(reason, outbox=outbox, owed_at=OWED, lead_min=0.0)
    return marks


@pytest.mark.parametrize(
    ("shown", "marks", "expires_at", "held", "snoozed_until", "expected"),
    [
        (EXPIRY, _marks(expiry=7), END, HELD, None, Settled.STANDS),
        (EXPIRY, _marks(expiry=9), END, HELD, None, Settled.SUPERSEDED),
        (EXPIRY, Marks(), END + timedelta(hours=2), HELD, None, Settled.EXTENDED),
        (EXPIRY, Marks(), END + timedelta(seconds=20), HELD, None, Settled.CLEARED),
        (IDLE, _marks(partly_idle=8), END, HELD, None, Settled.STANDS),
        (IDLE, Marks().with_kept(at=NOW), END, HELD, None, Settled.KEPT),
        (IDLE, Marks(), END, ("a:0",), None, Settled.GAVE_BACK),
        (IDLE, Marks(), END, HELD, NOW + timedelta(hours=2), Settled.SNOOZED),
        (IDLE, Marks(), END, HELD, NOW - timedelta(minutes=1), Settled.CLEARED),
        (IDLE, Marks(), END, HELD, OWED - timedelta(minutes=1), Settled.CLEARED),
        (WarningShown(9, "preempt", OWED), Marks(), END, HELD, None, Settled.WITHDRAWN),
        (WarningShown(9, "idle", OWED), Marks(), END, HELD, NOW + timedelta(hours=1), "snoozed"),
        (WarningShown(9, "unhealthy", OWED), Marks(), END, HELD, None, Settled.CLEARED),
    ],
)
def test_what_became_of_a_warning(
    shown: WarningShown,
    marks: Marks,
    expires_at: datetime,
    held: tuple[str, ...],
    snoozed_until: datetime | None,
    *,
    expected: str,
) -> None:
    """Each way a warning stops standing is told apart; the standing one stands."""
    found = settled(
        shown, marks, expires_at=expires_at, held=held, snoozed_until=snoozed_until, now=NOW
    )
    assert expected == found
