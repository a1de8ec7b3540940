"""The inbox records each acknowledged request once, hands it out until it is done, and forgets
finished rows only when Slack can no longer send them again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from storage import inbox
from storage.db import Database

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _accept(database: Database, key: str, actor: str = "U1", at: datetime = T0) -> int | None:
    with database.write() as session:
        return inbox.accept(
            session, key=key, kind="command", actor=actor, payload={"text": key}, at=at
        )


def test_a_key_recorded_before_is_not_recorded_again(database: Database) -> None:
    """A retry or a replay of an acknowledged request answers None and adds no row."""
    first = _accept(database, "body:abc")
    assert first is not None
    assert _accept(database, "body:abc") is None
    with database.read() as session:
        assert [(first, "U1")] == inbox.due(session, T0)


def test_due_rows_come_in_arrival_order_and_done_ones_leave(database: Database) -> None:
    """Workers see what waits, oldest first; a row taken (marked done) is not taken again."""
    ids = [_accept(database, f"k{n}", actor=f"U{n % 2}") for n in range(3)]
    with database.read() as session:
        assert [(ids[0], "U0"), (ids[1], "U1"), (ids[2], "U0")] == inbox.due(session, T0)
    with database.write() as session:
        assert inbox.take(session, ids[1] or 0, at=T0)
    with database.write() as session:
        assert not inbox.take(session, ids[1] or 0, at=T0)
        assert 2 == inbox.backlog(session)


def test_a_take_rolled_back_leaves_the_row_waiting(database: Database) -> None:
    """The done mark commits with the unit of work that carried the request out, or not."""
    row_id = _accept(database, "k")
    assert row_id is not None

    def carried_out_then_failed() -> None:
        with database.write() as session:
            assert inbox.take(session, row_id, at=T0)
            raise RuntimeError("the use case failed")

    with pytest.raises(RuntimeError):
        carried_out_then_failed()
    with database.read() as session:
        assert [row_id] == [i for i, _ in inbox.due(session, T0)]


def test_a_retry_waits_a_growing_backoff(database: Database) -> None:
    """Each failed attempt doubles the wait (2 s, 4 s ...), at most a minute."""
    row_id = _accept(database, "k")
    assert row_id is not None
    waits = []
    for _ in range(8):
        with database.write() as session:
            waits.append(inbox.retry_later(session, row_id, at=T0, error="locked") - T0)
    assert [timedelta(seconds=2), timedelta(seconds=4)] == waits[:2]
    assert timedelta(minutes=1) == waits[-1]
    with database.read() as session:
        assert [] == inbox.due(session, T0 + timedelta(seconds=59))
        assert [row_id] == [i for i, _ in inbox.due(session, T0 + timedelta(minutes=1))]


def test_a_failed_row_is_never_handed_out_again(database: Database) -> None:
    """Given up (the person was told): it leaves the backlog."""
    row_id = _accept(database, "k")
    assert row_id is not None
    with database.write() as session:
        inbox.failed(session, row_id, at=T0, error="bug")
    with database.write() as session:
        assert not inbox.take(session, row_id, at=T0)
        assert 0 == inbox.backlog(session)


def test_pruning_forgets_only_finished_rows_old_enough(database: Database) -> None:
    """Pending rows stay whatever their age; finished ones go once past the cut-off."""
    old_done = _accept(database, "old-done", at=T0)
    _accept(database, "old-pending", at=T0)
    new_done = _accept(database, "new-done", at=T0 + inbox.KEPT)
    with database.write() as session:
        for row_id in (old_done, new_done):
            assert inbox.take(session, row_id or 0, at=T0)
    with database.write() as session:
        assert 1 == inbox.prune(session, T0 + timedelta(hours=1))
    assert _accept(database, "old-done") is not None  # forgotten: a new request now
    assert _accept(database, "new-done") is None
