"""A message owed under a key is owed once: a second owe, in the same process or a racing
one, adds no row (the database's unique index decides)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from sqlmodel import select

from storage import outbox
from storage.db import Database
from storage.outbox import OutboxKind, Owed
from storage.tables import OutboxRow

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
DIGEST = Owed(OutboxKind.DIGEST, "digest:lab", "C1", {"period": "2026-W49"})


def test_a_second_owe_under_the_same_key_adds_nothing(database: Database) -> None:
    with database.write() as session:
        first = outbox.owe(session, DIGEST, at=T0, key="digest:lab:2026-W49")
        again = outbox.owe(session, DIGEST, at=T0, key="digest:lab:2026-W49")
        assert first is not None
        assert (first.id, None) == (outbox.owed_in(session)[-1], again)
    with database.write() as session:
        assert outbox.owe(session, DIGEST, at=T0, key="digest:lab:2026-W49") is None
        other = outbox.owe(session, DIGEST, at=T0, key="digest:lab:2026-W50")
        assert other is not None
    with database.read() as session:
        rows = session.exec(select(OutboxRow).order_by(OutboxRow.id)).all()  # type: ignore[arg-type]
        found = outbox.keyed(session, "digest:lab:2026-W49")
    assert ["digest:lab:2026-W49", "digest:lab:2026-W50"] == [r.dedupe_key for r in rows]
    assert found is not None
    assert ("digest", "C1", {"period": "2026-W49"}) == (found.kind, found.recipient, found.data)


def test_rows_without_a_key_are_never_folded(database: Database) -> None:
    """Many rows may have no key: the unique index leaves them alone."""
    with database.write() as session:
        outbox.owe(session, DIGEST, at=T0)
        outbox.owe(session, DIGEST, at=T0)
    with database.read() as session:
        assert 2 == len(session.exec(select(OutboxRow)).all())


def test_two_racing_owes_under_one_key_leave_one_row(shared_db: Database) -> None:
    """The first owe holds its transaction open while the second one runs: the second waits
    for the first commit and then adds nothing, without an error."""
    inserted, may_commit = threading.Event(), threading.Event()

    def first() -> bool:
        with shared_db.write() as session:
            row = outbox.owe(session, DIGEST, at=T0, key="digest:lab:2026-W49")
            inserted.set()
            may_commit.wait(timeout=2)
        return row is not None

    def second() -> bool:
        inserted.wait(timeout=10)
        threading.Timer(0.2, may_commit.set).start()  # the second owe is waiting by then
        with shared_db.write() as session:
            return outbox.owe(session, DIGEST, at=T0, key="digest:lab:2026-W49") is not None

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = [pool.submit(first), pool.submit(second)]
        results = [done.result() for done in outcomes]
    assert [True, False] == results
    with shared_db.read() as session:
        assert 1 == len(session.exec(select(OutboxRow)).all())
