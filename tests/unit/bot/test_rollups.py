"""The rollup job: completed hours only, the two rolled last again, a catch-up after
the bot was down, a first run that looks back no further than the minutes are kept, and the
hourly rows older than the setting pruned."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import col, select

from bot.services import BorrowAsk, Services, rollups
from storage import gpus, keyvalue
from storage.db import Database
from storage.tables import GpuHourRow, GpuMinuteRow
from tests.builders import default_sources
from tests.unit.bot.conftest import ALICE, T0, Clock, borrowed

H = timedelta(hours=1)


def minutes(
    services: Services, gpu: tuple[str, int], start: datetime, count: int, util: float
) -> None:
    """`count` minutes of `gpu` (node, index) from `start`, each at `util` %."""
    node, index = gpu
    with services.db.write() as session:
        gpus.store_minutes(
            session,
            [
                GpuMinuteRow(
                    node=node,
                    index=index,
                    minute=start + timedelta(minutes=m),
                    util_avg_pct=util,
                    util_max_pct=util,
                    memory_used_max_mib=4096,
                    samples=2,
                    ok_samples=2,
                )
                for m in range(count)
            ],
        )


def hourly(services: Services) -> list[tuple[datetime, float, float, float]]:
    """(hour, allocated, used, unreserved) of every hourly row, in order."""
    with services.db.read() as session:
        rows = session.exec(select(GpuHourRow).order_by(col(GpuHourRow.hour))).all()
    return [(r.hour, r.allocated_s, r.used_s, r.unreserved_s) for r in rows]


def run_at(services: Services, clock: Clock, at: datetime) -> int:
    clock.now = at
    return rollups.run(services.ctx, at)


def a_lease(services: Services) -> tuple[str, int]:
    """alice borrows one L40S at T0 (09:00) for 12 h; the GPU she got."""
    result = borrowed(services, ALICE, BorrowAsk("l40s", 1, timedelta(hours=12)))
    assert result.lease is not None
    gpu = result.lease.gpus[0]
    return gpu.node, gpu.index


def test_only_completed_hours_are_rolled_and_a_bot_down_five_hours_catches_up(
    services: Services, clock: Clock
) -> None:
    gpu = a_lease(services)
    minutes(services, gpu, T0, 8 * 60, 50.0)
    assert 0 == run_at(services, clock, T0 + timedelta(minutes=25))  # 09:00 is not over
    assert [] == hourly(services)
    assert 1 == run_at(services, clock, T0 + H + timedelta(minutes=5))  # 07:00 to 09:00
    assert [(T0, 3600.0, 1800.0, 0.0)] == hourly(services)
    assert 0 == run_at(services, clock, T0 + H + timedelta(minutes=15))  # no hour completed
    # down from 10:15 to 15:10: 10:00 to 14:00 rolled in one pass, 08:00 and 09:00 again
    assert 6 == run_at(services, clock, T0 + 6 * H + timedelta(minutes=10))
    assert [(T0 + h * H, 3600.0, 1800.0, 0.0) for h in range(6)] == hourly(services)
    with services.db.read() as session:
        assert T0 + 6 * H == keyvalue.rolled_until(session)


def test_the_two_hours_rolled_last_are_rolled_again(services: Services, clock: Clock) -> None:
    """Minutes of 10:00 pushed late, after 10:00 was rolled, count once 11:00 is over."""
    gpu = a_lease(services)
    minutes(services, gpu, T0, 90, 50.0)  # 09:00 to 10:30
    run_at(services, clock, T0 + 2 * H + timedelta(minutes=1))
    assert (T0 + H, 3600.0, 900.0, 0.0) == hourly(services)[1]
    minutes(services, gpu, T0 + H + timedelta(minutes=30), 30, 50.0)  # late
    assert 3 == run_at(services, clock, T0 + 3 * H + timedelta(minutes=1))
    assert [
        (T0, 3600.0, 1800.0, 0.0),
        (T0 + H, 3600.0, 1800.0, 0.0),
        (T0 + 2 * H, 3600.0, 0.0, 0.0),  # held, nothing stored: unknown, not used
    ] == hourly(services)


def test_the_first_run_starts_at_the_oldest_minute_kept(services: Services, clock: Clock) -> None:
    """Busy minutes on a free GPU 40 and 2 days ago: only the hour kept is rolled."""
    minutes(services, ("l40s-node-02", 3), T0 - timedelta(days=40), 60, 90.0)
    minutes(services, ("l40s-node-02", 3), T0 - timedelta(days=2), 60, 90.0)
    assert 1 == run_at(services, clock, T0)
    assert [(T0 - timedelta(days=2), 0.0, 0.0, 3600.0)] == hourly(services)
    with services.db.read() as session:
        assert T0 == keyvalue.rolled_until(session)


def test_nothing_stored_rolls_nothing_and_starts_from_now(services: Services, clock: Clock) -> None:
    assert 0 == run_at(services, clock, T0 + timedelta(minutes=30))
    with services.db.read() as session:
        assert T0 == keyvalue.rolled_until(session)


def test_hourly_rows_older_than_the_setting_go(database: Database, clock: Clock) -> None:
    """`reports.keep_hourly: 30d` in the rule files: a row of 30 days and an hour ago goes,
    one of 29 days and 23 hours ago stays."""
    sources = default_sources()
    sources["reports.yaml"] = sources["reports.yaml"].replace(
        "keep_hourly: 400d", "keep_hourly: 30d"
    )
    services = Services.open(database, sources, clock=clock)
    try:
        kept = timedelta(days=30)
        assert kept == services.policy.reports.keep_hourly
        with services.db.write() as session:
            for age in (kept + H, kept - H):
                session.add(GpuHourRow(hour=T0 - age, pool="l40s", node="l40s-node-01", index=0))
        run_at(services, clock, T0 + timedelta(minutes=5))
        assert [T0 - kept + H] == [row[0] for row in hourly(services)]
    finally:
        services.close()
