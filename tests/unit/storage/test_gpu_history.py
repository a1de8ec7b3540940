"""GPU history: rollups stored once per (node, index, minute), read back, and pruned."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import col, func, select

from bot.telemetry.window import TelemetryWindow
from storage.db import Database
from storage.gpus import prune_minutes, store_minutes, stored_minutes
from storage.tables import GpuMinuteRow
from tests.unit.telemetry.builders import a_sample, at


def a_minute(minute: float, index: int = 0, node: str = "a100-node-01") -> GpuMinuteRow:
    return GpuMinuteRow(
        node=node, index=index, minute=at(minute), util_avg_pct=12.5, util_max_pct=40.0,
        memory_used_max_mib=2048, samples=2, ok_samples=2,
    )  # fmt: skip


def count(database: Database) -> int:
    with database.read() as session:
        return int(session.exec(select(func.count()).select_from(GpuMinuteRow)).one())


def test_rollups_from_the_window_are_stored_and_read_back(database: Database) -> None:
    telemetry = TelemetryWindow(stale_after=timedelta(minutes=3))
    telemetry.observe(
        [a_sample(taken_at=at(m, s), index=i) for m in range(3) for s in (0, 30) for i in (0, 1)]
    )
    with database.write() as session:
        assert 6 == store_minutes(session, telemetry.minute_rollups(at(3, 30)))
    with database.read() as session:
        rows = stored_minutes(session, "a100-node-01", at(1), at(3), index=1)
    assert [(1, at(1), 2, 0.0), (1, at(2), 2, 0.0)] == [
        (r.index, r.minute, r.samples, r.util_avg_pct) for r in rows
    ]


def test_a_minute_already_stored_is_skipped_not_an_error(database: Database) -> None:
    """A rollup retried after a failed commit must not break the unique key or double up."""
    with database.write() as session:
        store_minutes(session, [a_minute(0), a_minute(1)])
    with database.write() as session:
        assert 1 == store_minutes(session, [a_minute(1), a_minute(2), a_minute(2)])
    assert 3 == count(database)


def test_prune_deletes_only_minutes_before_the_cutoff(database: Database) -> None:
    with database.write() as session:
        store_minutes(
            session, [a_minute(m) for m in range(10)] + [a_minute(3, node="l40s-node-01")]
        )
    with database.write() as session:
        assert 6 == prune_minutes(session, at(5))
    with database.read() as session:
        left = session.exec(select(GpuMinuteRow.minute).order_by(col(GpuMinuteRow.minute))).all()
    assert [at(m) for m in range(5, 10)] == list(left)


def test_storing_nothing_touches_nothing(database: Database) -> None:
    with database.write() as session:
        assert 0 == store_minutes(session, [])
    assert 0 == count(database)
