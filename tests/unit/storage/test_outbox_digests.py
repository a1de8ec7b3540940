"""The outbox reads behind the admin digest: a digest that may still grow, a person's newest
message from the bot, and the rows one message was delivered as."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from storage import outbox
from storage.db import Database
from storage.outbox import OutboxKind, Owed

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
WAIT = timedelta(seconds=10)


def _digest(database: Database, at: datetime) -> int:
    with database.write() as session:
        row = outbox.owe(
            session, Owed(OutboxKind.ADMIN_DIGEST, "admins", "U1", {"lines": []}), at=at, after=WAIT
        )
        assert row.id is not None
        return row.id


def test_only_a_digest_nobody_can_be_sending_may_grow(database: Database) -> None:
    """Pending, never tried, and not due before the margin: the one to add lines to."""
    first = _digest(database, T0)
    with database.read() as session:
        found = outbox.waiting(session, OutboxKind.ADMIN_DIGEST, "U1", not_before=T0)
        assert found is not None
        assert first == found.id
        too_late = T0 + WAIT
        assert outbox.waiting(session, OutboxKind.ADMIN_DIGEST, "U1", not_before=too_late) is None
        assert outbox.waiting(session, OutboxKind.ADMIN_DIGEST, "U2", not_before=T0) is None
    with database.write() as session:
        outbox.delivered(session, first, at=T0, channel="D1", ts="1.000001")
    with database.read() as session:
        assert outbox.waiting(session, OutboxKind.ADMIN_DIGEST, "U1", not_before=T0) is None


def test_the_newest_message_is_read_by_its_ts_and_a_message_by_its_rows(
    database: Database,
) -> None:
    """Two digest rows delivered as one message (the second updated the first in place), then
    a grant DM: the grant is the newest; the message's rows are both digests, oldest first."""
    one, two = _digest(database, T0), _digest(database, T0 + timedelta(minutes=1))
    with database.write() as session:
        grant = outbox.owe(session, Owed(OutboxKind.LEASE_GRANTED, "lease:1", "U1", {}), at=T0)
        assert grant.id is not None
        outbox.delivered(session, one, at=T0, channel="D1", ts="1.000001")
        outbox.delivered(session, two, at=T0, channel="D1", ts="1.000001")
    kinds = [OutboxKind.ADMIN_DIGEST, OutboxKind.LEASE_GRANTED]
    with database.read() as session:
        newest = outbox.latest_posted(session, "U1", kinds)
        assert newest is not None
        assert two == newest.id
    with database.write() as session:
        outbox.delivered(session, grant.id, at=T0, channel="D1", ts="1.000002")
    with database.read() as session:
        newest = outbox.latest_posted(session, "U1", kinds)
        assert newest is not None
        assert grant.id == newest.id
        same = outbox.delivered_as(session, OutboxKind.ADMIN_DIGEST, "D1", "1.000001")
        assert [one, two] == [r.id for r in same]
