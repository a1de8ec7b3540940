"""Many threads appending at once still build one chain: the head lock admits one at a time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from sqlmodel import select

from storage import audit
from storage.db import Database
from storage.tables import AuditRow

NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
THREADS, APPENDS = 8, 25


def append_from_threads(database: Database) -> None:
    def appender(worker: int) -> None:
        for n in range(APPENDS):
            entry = audit.AuditEntry(actor=f"U{worker}", tag="test:append", subject=f"n:{n}")
            with database.write() as session:
                audit.append(session, entry, at=NOW)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for done in [pool.submit(appender, worker) for worker in range(THREADS)]:
            done.result()


def assert_one_chain(database: Database) -> None:
    with database.read() as session:
        report = audit.verify(session)
        rows = session.exec(select(AuditRow.id, AuditRow.actor, AuditRow.subject)).all()
    assert audit.VerifyReport(ok=True, checked=THREADS * APPENDS) == report
    assert list(range(1, THREADS * APPENDS + 1)) == sorted(
        row_id for row_id, _, _ in rows if row_id is not None
    )
    expected = {(f"U{w}", f"n:{n}") for w in range(THREADS) for n in range(APPENDS)}
    assert expected == {(row[1], row[2]) for row in rows}


def test_concurrent_appends_build_one_unforked_chain(database: Database) -> None:
    """8 threads x 25 appends: every row present, one chain, verify passes."""
    append_from_threads(database)
    assert_one_chain(database)


def test_concurrent_appends_to_a_sqlite_file_build_one_unforked_chain(tmp_path: Path) -> None:
    """The same on a SQLite file, where each thread has its own connection."""
    database = Database(f"sqlite:///{tmp_path / 'gpubot.db'}")
    try:
        database.create_all()
        append_from_threads(database)
        assert_one_chain(database)
    finally:
        database.dispose()
