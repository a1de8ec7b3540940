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
from sqlmodel import SQLModel

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
            # The one index the models leave out on purpose (migration 0016): SQLAlchemy
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
