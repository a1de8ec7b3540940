"""The Home's "last 7 days": whole hours from the hourly rollups, the rest (the part of the first
hour inside the window, the hours not rolled up yet) from the per-minute history, each counted
once; every figure worked out by hand."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from bot.services import BorrowAsk, Services
from rules.reports import Usage
from storage import gpus
from storage.tables import GpuHourRow, GpuMinuteRow
from tests.unit.bot.conftest import ALICE, ERIN, T0, Clock, borrowed

H, M = timedelta(hours=1), timedelta(minutes=1)


def minutes(services: Services, node: str, index: int, first: datetime, utils: list[float]) -> None:
    with services.db.write() as session:
        gpus.store_minutes(
            session,
            [
                GpuMinuteRow(node=node, index=index, minute=first + n * M, util_avg_pct=util,
                             samples=2, ok_samples=2)
                for n, util in enumerate(utils)
            ],
        )  # fmt: skip


def rolled(services: Services, hour: datetime, holder: str, lease: int, **seconds: float) -> None:
    """One hourly row, as the rollup job writes it (the seconds given, the rest 0)."""
    with services.db.write() as session:
        row = GpuHourRow(hour=hour, pool="l40s", node="l40s-node-01", index=0, team="x",
                         holder=holder, lease_id=lease)  # fmt: skip
        for name, value in seconds.items():
            setattr(row, name, value)
        session.add(row)


def week_of(services: Services, user: str) -> Usage:
    week = services.home(user).week
    assert week is not None
    return week.usage


def test_rolled_hours_come_from_the_rollups_and_the_rest_from_the_minutes(
    services: Services, clock: Clock
) -> None:
    """Erin holds one l40s from 09:00; at 12:20 the rollups hold 09:00 and 10:00 (0.5 and 1.0
    GPU-h used); from 11:00 the minutes: 40 at 50 % (1/3 GPU-h used), then 40 with no
    reading. A minute at 100 % inside a rolled hour is not counted again.
    Held 3 h 20 m; used 0.5 + 1 + 1/3; busy 2 h 40 m; unknown 40 m; 10/3 h x 1.10."""
    lease = borrowed(services, ERIN, BorrowAsk("l40s", 1)).lease
    assert lease is not None
    node, index = lease.gpus[0].node, lease.gpus[0].index
    rolled(services, T0, ERIN, lease.id, allocated_s=3600, used_s=1800, busy_s=3600)
    rolled(services, T0 + H, ERIN, lease.id, allocated_s=3600, used_s=3600, busy_s=3600)
    minutes(services, node, index, T0 + H + 30 * M, [100.0])
    minutes(services, node, index, T0 + 2 * H, [50.0] * 40)
    clock.now = T0 + 3 * H + 20 * M
    week = week_of(services, ERIN)
    assert (10 / 3, 1.5 + 1 / 3, 8 / 3, 0.0, 2 / 3, 10 / 3 * 1.10) == pytest.approx(
        (week.allocated_h, week.used_h, week.busy_s / 3600, week.idle_h, week.unknown_h,
         week.cost)
    )  # fmt: skip


def test_the_first_hours_part_inside_the_window_comes_from_the_minutes(
    services: Services, clock: Clock
) -> None:
    """Erin held one l40s from 09:00 to 11:00 a week ago; now it is 09:30 a week later, so the
    window starts at 09:30 then. 09:30-10:00 from the minutes (30 at 100 %: 0.5 GPU-h used);
    the 10:00 hour from its rollup (0.25 used, 0.5 busy, 0.5 idle); the 09:00 rollup is not
    read (half of it is outside the window). Held 1.5 h; used 0.75 h: 50 %; 1.5 x 1.10."""
    lease = borrowed(services, ERIN, BorrowAsk("l40s", 1)).lease
    assert lease is not None
    node, index = lease.gpus[0].node, lease.gpus[0].index
    minutes(services, node, index, T0, [100.0] * 60)
    rolled(services, T0, ERIN, lease.id, allocated_s=3600, used_s=3600, busy_s=3600)
    rolled(services, T0 + H, ERIN, lease.id, allocated_s=3600, used_s=900, busy_s=1800,
           idle_s=1800)  # fmt: skip
    clock.now = T0 + 2 * H
    services.release(ERIN, lease.id)
    clock.now = T0 + timedelta(days=7, minutes=30)
    rolled(services, T0 + timedelta(days=7) - H, ALICE, 99, allocated_s=3600)  # rolled to 09:00
    week = week_of(services, ERIN)
    assert (1.5, 0.75, 0.5, 1.0, 0.5, 0.0, 1.65) == pytest.approx(
        (week.allocated_h, week.used_h, week.efficiency, week.busy_s / 3600, week.idle_h,
         week.unknown_h, week.cost)
    )  # fmt: skip


def test_with_nothing_rolled_up_the_minutes_give_the_whole_week(
    services: Services, clock: Clock
) -> None:
    """Two hours held, an hour of readings at 20 %: 0.2 used, 1 busy, 1 unknown."""
    lease = borrowed(services, ERIN, BorrowAsk("l40s", 1)).lease
    assert lease is not None
    minutes(services, lease.gpus[0].node, lease.gpus[0].index, T0, [20.0] * 60)
    clock.now = T0 + 2 * H
    week = week_of(services, ERIN)
    assert (2.0, 0.2, 1.0, 1.0) == pytest.approx(
        (week.allocated_h, week.used_h, week.busy_s / 3600, week.unknown_h)
    )
