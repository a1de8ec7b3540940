"""The history a rules simulation reads, on SQLite and PostgreSQL: each stored minute placed
and judged by the database, and the last simulation of a revision kept under its key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from storage import keyvalue, replay
from storage.db import Database
from storage.gpus import store_minutes
from storage.tables import GpuMinuteRow

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def a_minute(
    index: int, minute: int, util_max: float | None, util_avg: float | None = None, ok: int = 2
) -> GpuMinuteRow:
    return GpuMinuteRow(
        node="n1",
        index=index,
        minute=T0 + timedelta(minutes=minute),
        util_avg_pct=util_max if util_avg is None else util_avg,
        util_max_pct=util_max,
        samples=2,
        ok_samples=ok,
    )


def test_each_stored_minute_is_placed_and_judged_by_the_database(database: Database) -> None:
    """0 unknown (nothing stored, or no working reading), 1 idle (under the busy threshold),
    2 busy (the highest reading at or above it; the average when only that was kept). Minutes
    outside the window, and other nodes, are left out."""
    with database.write() as session:
        store_minutes(
            session,
            [
                a_minute(0, -1, 90.0),  # before the window
                a_minute(0, 0, 0.0),
                a_minute(0, 1, 4.9),
                a_minute(0, 2, 5.0),
                a_minute(0, 3, 80.0, util_avg=2.0),  # a spike: busy
                a_minute(0, 5, None, ok=0),  # the NVML call failed
                a_minute(0, 6, None, util_avg=50.0),
                a_minute(1, 1, 3.0),
                a_minute(1, 8, 3.0),  # after the window
            ],
        )
        other = a_minute(0, 0, 99.0)
        other.node = "n2"
        store_minutes(session, [other])
    with database.read() as session:
        states = replay.minute_states(session, "n1", T0, T0 + timedelta(minutes=8), busy_pct=5.0)
    assert {0: bytes([1, 1, 2, 2, 0, 0, 2, 0]), 1: bytes([0, 1, 0, 0, 0, 0, 0, 0])} == {
        index: bytes(s) for index, s in states.items()
    }


def test_the_last_simulation_of_a_revision_is_kept_under_its_key(database: Database) -> None:
    with database.write() as session:
        keyvalue.set_simulation(session, "abc", '{"changed": 1}', at=T0, by="U1")
        keyvalue.set_simulation(session, "abc", '{"changed": 2}', at=T0, by="U1")
    with database.read() as session:
        assert ('{"changed": 2}', None) == (
            keyvalue.simulation(session, "abc"),
            keyvalue.simulation(session, "def"),
        )
