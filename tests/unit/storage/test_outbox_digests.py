"""The outbox reads behind the admin digest: a digest that may still grow, a person's newest
message from the bot, and the rows one message was delivered as."""

from __future__ import annotations

import threading
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


def test_a_claim_waits_for_a_digest_growing_and_then_sees_its_line(database: Database) -> None:
    """A line is being added to a digest when a deliverer claims it: the claim waits for that
    commit, so the digest, drawn after its claim, has the line."""
    first = _digest(database, T0)
    locked, go_on = threading.Event(), threading.Event()

    def grow() -> None:
        with database.write() as session:
            found = outbox.waiting(session, OutboxKind.ADMIN_DIGEST, "U1", not_before=T0)
            assert found is not None
            locked.set()
            go_on.wait(0.5)  # the claim, started meanwhile, waits for this commit
            found.data = {"lines": [{"subject": "s", "text": "added"}]}
            session.add(found)

    grower = threading.Thread(target=grow)
    grower.start()
    assert locked.wait(5)
    with database.read() as session:
        row = outbox.get(session, first)
    assert row is not None
    with database.write() as session:
        claimed = outbox.claim(session, row, at=T0 + WAIT, by="deliverer")
    with database.read() as session:  # drawn as soon as it is claimed
        drawn = outbox.get(session, first)
    go_on.set()
    grower.join()
    assert drawn is not None
    assert (True, [{"subject": "s", "text": "added"}]) == (claimed, drawn.data["lines"])


def test_a_redraw_not_claimed_yet_is_untaken(database: Database) -> None:
    """Pending: untaken (it will show what commits before its claim); claimed: taken."""
    with database.write() as session:
        owed = Owed(OutboxKind.LEASE_REDRAWN, "lease:1", "U1", {"lease": 1})
        row = outbox.owe(session, owed, at=T0, after=WAIT)
    with database.read() as session:
        assert outbox.untaken(session, "lease:1", OutboxKind.LEASE_REDRAWN)
        assert not outbox.untaken(session, "lease:2", OutboxKind.LEASE_REDRAWN)
    with database.write() as session:
        assert outbox.claim(session, row, at=T0 + WAIT, by="deliverer")
    with database.read() as session:
        assert not outbox.untaken(session, "lease:1", OutboxKind.LEASE_REDRAWN)


def test_of_several_digests_that_may_grow_the_newest_is_grown(database: Database) -> None:
    """A pass fills one digest after another: lines go to the newest, whichever engine."""
    _digest(database, T0)
    newest = _digest(database, T0 + timedelta(seconds=1))
    with database.read() as session:
        found = outbox.waiting(session, OutboxKind.ADMIN_DIGEST, "U1", not_before=T0)
        assert found is not None
        assert newest == found.id
