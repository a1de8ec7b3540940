"""The outbox keeps what is owed until it is delivered, retrying with a growing backoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from storage import outbox
from storage.db import Database
from storage.outbox import OutboxKind, Owed
from storage.tables import OutboxRow

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_due_rows_come_oldest_first_and_delivered_ones_leave(database: Database) -> None:
    """Delivery order is the order the decisions owed the messages."""
    with database.write() as session:
        first = outbox.owe(
            session, Owed(OutboxKind.LEASE_GRANTED, "lease:1", "U1", {"lease": 1}), at=T0
        )
        outbox.owe(session, Owed(OutboxKind.LEASE_GRANTED, "lease:2", "U2", {"lease": 2}), at=T0)
    with database.write() as session:
        assert ["lease:1", "lease:2"] == [r.subject for r in outbox.due(session, T0)]
        assert first.id is not None
        outbox.delivered(session, first.id, at=T0, channel="D1", ts="1.000001")
    with database.read() as session:
        assert ["lease:2"] == [r.subject for r in outbox.due(session, T0)]
        landed = outbox.landed(session, "lease:1", ["lease_granted"])
        assert [("D1", "1.000001")] == [(r.channel, r.ts) for r in landed]


def test_a_failed_delivery_stays_owed_and_backs_off(database: Database) -> None:
    """Failures never drop a message; each claim doubles the wait, up to five minutes."""
    with database.write() as session:
        row = outbox.owe(session, Owed(OutboxKind.APPROVAL_CARD, "request:1", "C1", {}), at=T0)
    assert row.id is not None
    waits = []
    for _ in range(12):
        with database.read() as session:
            current = session.get(OutboxRow, row.id)
        assert current is not None
        with database.write() as session:
            assert outbox.claim(session, current, at=T0, by="me")
        with database.write() as session:
            retry = outbox.failed(session, row.id, at=T0, error="ratelimited")
        assert retry is not None
        waits.append(retry - T0)
        with database.write() as session:  # the next attempt has come
            again = session.get(OutboxRow, row.id)
            assert again is not None
            again.next_attempt_at = T0
            session.add(again)
    assert [timedelta(seconds=2), timedelta(seconds=4), timedelta(seconds=8)] == waits[:3]
    assert timedelta(minutes=5) == waits[-1]
    with database.read() as session:
        again_row = session.get(OutboxRow, row.id)
        assert again_row is not None
        assert (12, "ratelimited", "pending") == (
            again_row.attempts,
            again_row.last_error,
            again_row.state,
        )


def test_a_claimed_row_waits_its_backoff_even_if_its_outcome_is_never_recorded(
    database: Database,
) -> None:
    """The claim commits the next attempt before the send: a lost outcome cannot loop."""
    with database.write() as session:
        row = outbox.owe(session, Owed(OutboxKind.LEASE_GRANTED, "lease:1", "U1", {}), at=T0)
    with database.write() as session:
        assert outbox.claim(session, row, at=T0, by="me")
    with database.read() as session:
        assert [] == outbox.due(session, T0 + timedelta(seconds=1))
        assert [row.id] == [r.id for r in outbox.due(session, T0 + timedelta(seconds=2))]
        (claimed,) = outbox.due(session, T0 + timedelta(seconds=2))
    assert ("sending", "me", 1) == (claimed.state, claimed.claimed_by, claimed.attempts)


def test_one_claim_wins_when_two_deliverers_race_for_a_row(database: Database) -> None:
    """Both read the row; only the first claim takes it."""
    with database.write() as session:
        row = outbox.owe(session, Owed(OutboxKind.LEASE_GRANTED, "lease:1", "U1", {}), at=T0)
    with database.read() as session:
        seen_by_a = session.get(OutboxRow, row.id)
        seen_by_b = session.get(OutboxRow, row.id)
    assert seen_by_a is not None
    assert seen_by_b is not None
    with database.write() as session:
        assert outbox.claim(session, seen_by_a, at=T0, by="a")
    with database.write() as session:
        assert not outbox.claim(session, seen_by_b, at=T0, by="b")


def test_a_row_is_given_up_after_the_attempt_limit(database: Database) -> None:
    """Past max_attempts the row is failed, not retried forever."""
    with database.write() as session:
        row = outbox.owe(session, Owed(OutboxKind.LEASE_GRANTED, "lease:1", "U1", {}), at=T0)
    with database.write() as session:
        assert outbox.claim(session, row, at=T0, by="me")
    with database.write() as session:
        assert outbox.failed(session, row.id or 0, at=T0, error="down", max_attempts=1) is None
    with database.read() as session:
        assert [] == outbox.due(session, T0 + timedelta(days=1))
        assert {"failed": 1} == outbox.counts(session)


def test_a_deferred_row_waits_and_is_not_sent_with_what_the_request_owed(
    database: Database,
) -> None:
    """`after`: a cosmetic redraw is due later and stays out of the express claim."""
    with database.write() as session:
        now = outbox.owe(session, Owed(OutboxKind.REPLY, "request:1", "U1", {}), at=T0)
        later = outbox.owe(
            session,
            Owed(OutboxKind.CARD_SETTLED, "request:2", "cards", {}),
            at=T0,
            after=timedelta(seconds=30),
        )
        assert [now.id] == outbox.owed_in(session)
    with database.read() as session:
        assert [now.id] == [r.id for r in outbox.due(session, T0)]
        due = outbox.due(session, T0 + timedelta(seconds=30))
        assert [now.id, later.id] == [r.id for r in due]
