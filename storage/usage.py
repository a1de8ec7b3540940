"""A person's recent use: the GPU-minutes their leases held in a window, and of those the
minutes the per-minute history saw, and saw busy; the same as report figures (`held_usage`,
counted as the hourly rollups count them) for the hours not rolled up yet."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from rules.domain import LeaseState
from rules.reports import HOUR, Usage
from storage.tables import GpuHourRow, GpuMinuteRow, GpuRow, LeaseGpuRow, LeaseRow, NodeRow

MINUTE_S = 60.0
#: Leases that never held a GPU (asked, waiting or refused): the rollups skip them too.
_NEVER_HELD = (LeaseState.PENDING, LeaseState.QUEUED, LeaseState.DENIED, LeaseState.CANCELLED)


def held_usage(
    session: Session,
    holder: str,
    since: datetime,
    until: datetime,
    *,
    busy_pct: float,
    prices: Mapping[str, float],
) -> Usage:
    """What `holder`'s leases held in [since, until), read from the stored minutes and counted
    as the hourly rollups count it: allocated exactly from the intervals; a minute belongs to
    the interval it starts in; used weighted by utilisation; busy and idle the observed minutes
    at or above and under `busy_pct`; unknown the rest of the allocated time, never idle."""
    total = Usage()
    for node, index, lease, held_gpu in session.exec(_held(holder, since, until)).all():
        if lease.state in _NEVER_HELD:
            continue
        ended_at = held_gpu.released_at or lease.ended_at
        start, end = max(lease.granted_at, since), min(ended_at or until, until)
        if end <= start:
            continue
        allocated = (end - start).total_seconds()
        seen, worked, util_pct = _sums(session, node, index, start, end, busy_pct=busy_pct)
        busy_s, idle_s = worked * MINUTE_S, (seen - worked) * MINUTE_S
        total += Usage(
            allocated_s=allocated,
            used_s=util_pct / 100 * MINUTE_S,
            busy_s=busy_s,
            idle_s=idle_s,
            unknown_s=max(0.0, allocated - busy_s - idle_s),
            cost=allocated / HOUR * prices.get(lease.pool, 0.0),
        )
    return total


def rolled_until(session: Session) -> datetime | None:
    """The end of the latest hour the hourly rollups hold (None: they hold nothing yet)."""
    latest = session.connection().execute(sa.select(sa.func.max(col(GpuHourRow.hour)))).scalar()
    if latest is None:
        return None
    if isinstance(latest, str):  # a bare aggregate loses the column's type on SQLite
        latest = datetime.fromisoformat(latest)
    assert isinstance(latest, datetime)
    aware = latest.replace(tzinfo=UTC) if latest.tzinfo is None else latest
    return aware + timedelta(hours=1)


def _held(holder: str, since: datetime, until: datetime) -> Any:
    """Each GPU of `holder`'s leases that overlap [since, until), with its node and index."""
    return (
        select(NodeRow.name, GpuRow.index, LeaseRow, LeaseGpuRow)
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .where(
            LeaseRow.holder == holder,
            col(LeaseRow.granted_at) < until,
            sa.or_(col(LeaseRow.ended_at).is_(None), col(LeaseRow.ended_at) > since),
        )
    )


def _sums(
    session: Session, node: str, index: int, start: datetime, end: datetime, *, busy_pct: float
) -> tuple[int, int, float]:
    """The observed minutes of one GPU in [start, end), those busy, and their utilisation sum."""
    observed = sa.and_(
        col(GpuMinuteRow.ok_samples) > 0, col(GpuMinuteRow.util_avg_pct).is_not(None)
    )
    busy = sa.and_(observed, col(GpuMinuteRow.util_avg_pct) >= busy_pct)
    stmt = sa.select(
        sa.func.coalesce(sa.func.sum(sa.case((observed, 1), else_=0)), 0),
        sa.func.coalesce(sa.func.sum(sa.case((busy, 1), else_=0)), 0),
        sa.func.coalesce(
            sa.func.sum(sa.case((observed, col(GpuMinuteRow.util_avg_pct)), else_=0.0)), 0.0
        ),
    ).where(
        col(GpuMinuteRow.node) == node,
        col(GpuMinuteRow.index) == index,
        col(GpuMinuteRow.minute) >= start,
        col(GpuMinuteRow.minute) < end,
    )
    seen, worked, util = session.connection().execute(stmt).one()
    return int(seen), int(worked), float(util)


def _minutes(
    session: Session, node: str, index: int, start: datetime, end: datetime, *, busy_pct: float
) -> tuple[int, int]:
    busy = sa.case((col(GpuMinuteRow.util_avg_pct) >= busy_pct, 1), else_=0)
    stmt = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(busy), 0)).where(
        col(GpuMinuteRow.node) == node,
        col(GpuMinuteRow.index) == index,
        col(GpuMinuteRow.minute) >= start,
        col(GpuMinuteRow.minute) < end,
        col(GpuMinuteRow.ok_samples) > 0,
        col(GpuMinuteRow.util_avg_pct).is_not(None),
    )
    seen, worked = session.connection().execute(stmt).one()
    return int(seen), int(worked)
