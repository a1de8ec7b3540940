"""The outbox keeps what is owed until it is delivered, retrying with a growing backoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from storage import outbox
from storage.db import Database
from storage.outbox import Owed

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_due_rows_come_oldest_first_and_delivered_ones_leave(database: Database) -> None:
    """Delivery order is the order the decisions owed the messages."""
    with database.write() as session:
        first = outbox.owe(session, Owed("lease_granted", "lease:1", "U1", {"lease": 1}), at=T0)
        outbox.owe(session, Owed("lease_granted", "lease:2", "U2", {"lease": 2}), at=T0)
    with database.write() as session:
        assert ["lease:1", "lease:2"] == [r.subject for r in outbox.due(session, T0)]
        assert first.id is not None
        outbox.delivered(session, first.id, at=T0, channel="D1", ts="1.000001")
    with database.read() as session:
        assert ["lease:2"] == [r.subject for r in outbox.due(session, T0)]
        landed = outbox.landed(session, "lease:1", ["lease_granted"])
        assert [("D1", "1.000001")] == [(r.channel, r.ts) for r in landed]


def test_a_failed_delivery_stays_owed_and_backs_off(database: Database) -> None:
    """Failures never drop a message; each one doubles the wait, up to five minutes."""
    with database.write() as session:
        row = outbox.owe(session, Owed("approval_card", "request:1", "C1", {}), at=T0)
    assert row.id is not None
    waits = []
    for _ in range(12):
        with database.write() as session:
            waits.append(outbox.failed(session, row.id, at=T0, error="ratelimited") - T0)
    assert [timedelta(seconds=2), timedelta(seconds=4), timedelta(seconds=8)] == waits[:3]
    assert timedelta(minutes=5) == waits[-1]
    with database.read() as session:
        assert [] == outbox.due(session, T0 + timedelta(minutes=4))
        again = outbox.due(session, T0 + timedelta(minutes=5))
        assert [(12, "ratelimited")] == [(r.attempts, r.last_error) for r in again]
