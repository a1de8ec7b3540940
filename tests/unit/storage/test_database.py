"""`Database`: URLs, transactions that commit or roll back whole, SQLite tuned for many writers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import func, select

from storage.db import Database, lock_for_update, normalise_url
from storage.tables import PoolRow, SettingRow

NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    "url",
    [
        "postgres://gpubot:pw@db:5432/gpubot",
        "postgresql://gpubot:pw@db:5432/gpubot",
        "postgresql+psycopg://gpubot:pw@db:5432/gpubot",
    ],
)
def test_every_postgres_spelling_uses_psycopg(url: str) -> None:
    """Heroku-style and plain PostgreSQL URLs are sent to the psycopg 3 driver."""
    assert "postgresql+psycopg" == normalise_url(url).drivername


def test_the_dialect_is_named(database: Database) -> None:
    """`dialect` says which backend the URL selected."""
    assert database.dialect in ("sqlite", "postgresql")


def test_a_write_block_commits_when_it_ends(database: Database) -> None:
    """Rows added in `write()` are there for the next reader."""
    with database.write() as session:
        session.add(PoolRow(name="a100"))
    with database.read() as session:
        assert ["a100"] == list(session.exec(select(PoolRow.name)))


def test_a_write_block_rolls_back_when_it_raises(database: Database) -> None:
    """An exception inside `write()` leaves nothing behind and propagates."""

    def add_then_fail() -> None:
        with database.write() as session:
            session.add(PoolRow(name="a100"))
            session.flush()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        add_then_fail()
    with database.read() as session:
        assert [] == list(session.exec(select(PoolRow.name)))


def test_lock_for_update_locks_rows_only_on_postgres(database: Database) -> None:
    """FOR UPDATE is added on PostgreSQL; SQLite already serialises its writers."""
    with database.read() as session:
        stmt = lock_for_update(session, select(PoolRow))
    rendered = str(stmt.compile(dialect=sa.create_engine("postgresql+psycopg://").dialect))
    assert (database.dialect == "postgresql") == ("FOR UPDATE" in rendered)


def test_a_sqlite_file_is_opened_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    """A file database gets WAL, NORMAL sync, a 30 s busy timeout and enforced foreign keys."""
    database = Database(f"sqlite:///{tmp_path / 'gpubot.db'}")
    try:
        with database.read() as session:
            pragmas = [
                session.execute(sa.text(f"PRAGMA {name}")).scalar_one()
                for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")
            ]
    finally:
        database.dispose()
    assert ["wal", 1, 30_000, 1] == pragmas


def test_concurrent_read_then_write_transactions_all_succeed_on_a_sqlite_file(
    tmp_path: Path,
) -> None:
    """BEGIN IMMEDIATE makes writers queue instead of failing with "database is locked"."""
    database = Database(f"sqlite:///{tmp_path / 'gpubot.db'}")
    database.create_all()

    def count_then_insert(worker: int) -> None:
        for turn in range(20):
            with database.write() as session:
                seen = session.exec(select(func.count()).select_from(SettingRow)).one()
                session.add(
                    SettingRow(
                        key=f"{worker}-{turn}", value=str(seen), updated_at=NOW, updated_by="U"
                    )
                )

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            for done in [pool.submit(count_then_insert, worker) for worker in range(8)]:
                done.result()
        with database.read() as session:
            seen_counts = sorted(int(value) for value in session.exec(select(SettingRow.value)))
    finally:
        database.dispose()
    # Each writer saw every earlier commit: the transactions ran one after another.
    assert list(range(160)) == seen_counts


def _pools(database: Database) -> list[str]:
    with database.read() as session:
        return sorted(p.name for p in session.exec(select(PoolRow)).all())


def test_a_unit_of_work_commits_every_write_inside_it_together(database: Database) -> None:
    """Writes and reads inside `unit()` share one transaction: reads see the writes before
    the commit, and everything lands at once."""
    with database.unit():
        with database.write() as session:
            session.add(PoolRow(name="a100"))
        with database.read() as session:
            assert ["a100"] == sorted(p.name for p in session.exec(select(PoolRow)).all())
        with database.write() as session:
            session.add(PoolRow(name="l40s"))
    assert ["a100", "l40s"] == _pools(database)


def test_a_unit_of_work_that_raises_leaves_nothing_behind(database: Database) -> None:
    """The use case and its bookkeeping commit together or not at all."""

    def use_case() -> None:
        with database.unit():
            with database.write() as session:
                session.add(PoolRow(name="a100"))
            raise RuntimeError("the answer could not be owed")

    with pytest.raises(RuntimeError):
        use_case()
    assert [] == _pools(database)


def test_a_write_that_fails_inside_a_unit_rolls_back_only_itself(database: Database) -> None:
    """A write block inside a unit is a savepoint: a caught failure keeps the rest."""
    with database.unit():
        with database.write() as session:
            session.add(PoolRow(name="a100"))

        def again() -> None:
            with database.write() as session:
                session.add(PoolRow(name="a100"))
                session.flush()

        with pytest.raises(sa.exc.IntegrityError):
            again()
        with database.write() as session:
            session.add(PoolRow(name="l40s"))
    assert ["a100", "l40s"] == _pools(database)


def test_units_of_work_do_not_nest(database: Database) -> None:
    """A second unit inside the first is a bug, said at once."""
    with database.unit(), pytest.raises(RuntimeError, match="do not nest"), database.unit():
        pass


def test_a_brief_write_gives_up_while_another_process_holds_sqlite(tmp_path: Path) -> None:
    """The ack path's write waits about two seconds for a locked SQLite file, then raises
    instead of waiting out the full busy timeout."""
    import sqlite3

    path = tmp_path / "locked.db"
    database = Database(f"sqlite:///{path}")
    database.create_all()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(sa.exc.OperationalError), database.brief() as session:
            session.add(PoolRow(name="a100"))
        other.execute("ROLLBACK")
        with database.brief() as session:
            session.add(PoolRow(name="a100"))
        assert ["a100"] == _pools(database)
    finally:
        other.close()
        database.dispose()


def test_a_snapshot_read_sees_the_database_as_its_first_statement_saw_it(
    shared_db: Database,
) -> None:
    """Reads that must agree (the sweep's GPUs and the leases holding them) do not see a write
    committed between them; a plain read on PostgreSQL sees each write once it is committed."""

    def count(session: Any) -> int:
        return int(session.exec(select(func.count()).select_from(PoolRow)).one())

    def add(name: str) -> None:
        with shared_db.write() as session:
            session.add(PoolRow(name=name))

    with shared_db.read(snapshot=True) as session:
        before = count(session)
        with ThreadPoolExecutor(1) as other:
            other.submit(add, "snap-a").result()
        assert before == count(session)
    with shared_db.read() as session:
        assert before + 1 == count(session)
    if shared_db.dialect == "postgresql":
        with shared_db.read() as session:
            count(session)
            with ThreadPoolExecutor(1) as other:
                other.submit(add, "snap-b").result()
            assert before + 2 == count(session)


def test_a_block_holds_others_off_on_one_in_memory_connection_or_in_a_unit(
    tmp_path: Path,
) -> None:
    """The sweep's long reads let others go first between chunks only where others can reach
    the database meanwhile."""
    memory, file = Database("sqlite://"), Database(f"sqlite:///{tmp_path / 'g.db'}")
    try:
        file.create_all()
        assert memory.holds_others_off()
        assert not file.holds_others_off()
        with file.unit():
            assert file.holds_others_off()
        assert not file.holds_others_off()
    finally:
        memory.dispose()
        file.dispose()
