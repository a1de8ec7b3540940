"""Migrations build exactly the schema the models describe, on SQLite and on PostgreSQL."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlmodel import SQLModel, col

from storage import migrate
from storage.db import Database
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, PoolRow

NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with nothing in it: a new SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpubot.db'}"
    else:
        url: str = request.getfixturevalue("postgres_url")
        yield url


def differences(url: str) -> list[object]:
    database = Database(url)
    try:
        with database.read() as session, warnings.catch_warnings():
            # The one index the models leave out on purpose (migration 0017): SQLAlchemy
            # cannot reflect an index on an expression, says so, and compares the rest.
            warnings.filterwarnings(
                "ignore", "Skipped unsupported reflection of expression-based index "
                "ix_gpu_hour_lease_day", sa.exc.SAWarning,
            )  # fmt: skip
            context = MigrationContext.configure(session.connection())
            return list(compare_metadata(context, SQLModel.metadata))
    finally:
        database.dispose()


def test_upgrade_builds_exactly_the_models_schema(empty_url: str) -> None:
    """After upgrade, autogenerate finds nothing to add, drop or alter."""
    migrate.upgrade(empty_url)
    assert [] == differences(empty_url)


def test_upgrade_twice_changes_nothing(empty_url: str) -> None:
    """A second upgrade is a no-op that leaves the database at head."""
    migrate.upgrade(empty_url)
    migrate.upgrade(empty_url)
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert (head, []) == (migrate.current(empty_url), differences(empty_url))


def test_current_is_none_before_the_first_upgrade(empty_url: str) -> None:
    """A database never migrated has no revision."""
    assert migrate.current(empty_url) is None


def test_the_migrated_schema_refuses_a_gpu_in_two_active_leases(empty_url: str) -> None:
    """The partial unique index comes out of the migration working, not just named."""
    migrate.upgrade(empty_url)
    database = Database(empty_url)
    try:
        with database.write() as session:
            # Parents are flushed first: without relationship()s the ORM does not order by FK.
            for parent in (
                PoolRow(name="a100"),
                NodeRow(id=1, name="node-1", pool="a100"),
                GpuRow(id=1, node_id=1, index=0, pool="a100"),
            ):
                session.add(parent)
                session.flush()
            for lease_id in (1, 2, 3):
                session.add(
                    LeaseRow(
                        id=lease_id,
                        holder="U1",
                        team="vision",
                        pool="a100",
                        gpus=1,
                        state="active",
                        granted_at=NOW,
                        expires_at=NOW,
                    )
                )
            session.flush()
            session.add(LeaseGpuRow(lease_id=1, gpu_id=1, active=False))
            session.add(LeaseGpuRow(lease_id=2, gpu_id=1))
        with pytest.raises(sa.exc.IntegrityError), database.write() as session:
            session.add(LeaseGpuRow(lease_id=3, gpu_id=1))
    finally:
        database.dispose()


def held_gpus(database: Database) -> dict[int, bool]:
    with database.read() as session:
        rows = session.connection().execute(sa.select(col(GpuRow.id), col(GpuRow.held))).all()
    return {int(gpu_id or 0): bool(held) for gpu_id, held in rows}


def rows_of(name: str, rows: list[dict[str, object]]) -> sa.Insert:
    """An insert of plain rows into a table as an older revision has it (no model columns)."""
    return sa.insert(sa.table(name, *(sa.column(key) for key in rows[0]))).values(rows)


def test_the_migration_marks_the_held_gpus_and_its_triggers_keep_them(empty_url: str) -> None:
    """Upgraded over leases already granted, `gpu.held` names the GPUs in active leases; the
    migrated triggers then follow a grant, a release and a deleted lease GPU."""
    migrate.upgrade(empty_url, "0015")
    database = Database(empty_url)
    lease = {"holder": "U1", "team": "vision", "pool": "a100", "gpus": 1, "priority": "normal"}
    more = {"protected": False, "reason": "", "state": "active", "end_reason": ""}
    counts = {"extensions": 0, "extended_s": 0, "snoozes": 0, "warnings": "{}"}
    try:
        with database.begin() as connection:
            connection.execute(rows_of("pool", [{"name": "a100", "model": "", "protected": False}]))
            node = {"id": 1, "name": "node-1", "pool": "a100", "drained": False}
            connection.execute(
                rows_of("node", [{**node, "reporting": "unknown", "driver": "", "cuda": ""}])
            )
            gpu = {"node_id": 1, "model": "", "memory_mib": 0, "pool": "a100", "state": "ok"}
            connection.execute(
                rows_of(
                    "gpu",
                    [
                        {"id": i, "index": i, **gpu, "observed": "unknown", "occupants": "[]"}
                        for i in (1, 2, 3)
                    ],
                )
            )
            connection.execute(
                rows_of(
                    "lease",
                    [
                        {"id": i, **lease, **more, **counts, "granted_at": NOW, "expires_at": NOW}
                        for i in (1, 2, 3)
                    ],
                )
            )
            connection.execute(
                rows_of(
                    "lease_gpu",
                    [
                        {"lease_id": 1, "gpu_id": 1, "active": True},
                        {"lease_id": 2, "gpu_id": 2, "active": False},
                    ],
                )
            )
        migrate.upgrade(empty_url)
        assert {1: True, 2: False, 3: False} == held_gpus(database)
        with database.write() as session:
            session.add(LeaseGpuRow(lease_id=3, gpu_id=3))
            session.execute(
                sa.update(LeaseGpuRow).where(col(LeaseGpuRow.lease_id) == 1).values(active=False)
            )
            session.add(LeaseGpuRow(lease_id=2, gpu_id=1))
        assert {1: True, 2: False, 3: True} == held_gpus(database)
        with database.write() as session:
            session.execute(sa.delete(LeaseGpuRow).where(col(LeaseGpuRow.lease_id) == 3))
        assert {1: True, 2: False, 3: False} == held_gpus(database)
    finally:
        database.dispose()
