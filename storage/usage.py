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
    as the hourly rollups count it: allocated exactly from the intervals; a minute counts by
    the seconds of it inside the interval; used weighted by utilisation; busy and idle the
    observed seconds at or above and under `busy_pct`; unknown the rest of the allocated time,
    never idle."""
    total = Usage()
    for node, index, lease, held_gpu in session.exec(_held(holder, since, until)).all():
        if lease.state in _NEVER_HELD:
            continue
        ended_at = held_gpu.released_at or lease.ended_at
        start, end = max(lease.granted_at, since), min(ended_at or until, until)
        if end <= start:
            continue
        allocated = (end - start).total_seconds()
        observed_s, busy_s, util_pct_s = _sums(session, node, index, start, end, busy_pct=busy_pct)
        idle_s = round(observed_s - busy_s, 3)
        total += Usage(
            allocated_s=allocated,
            used_s=round(util_pct_s / 100, 3),
            busy_s=busy_s,
            idle_s=idle_s,
            unknown_s=max(0.0, round(allocated - busy_s - idle_s, 3)),
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
) -> tuple[float, float, float]:
    """The seconds of [start, end) one GPU's stored minutes saw, those busy, and utilisation x
    seconds: every minute that overlaps counted whole, then the minutes at the two ends cut
    to the part inside."""
    observed = sa.and_(
        col(GpuMinuteRow.ok_samples) > 0, col(GpuMinuteRow.util_avg_pct).is_not(None)
    )
    busy = sa.and_(observed, col(GpuMinuteRow.util_avg_pct) >= busy_pct)
    here = (col(GpuMinuteRow.node) == node, col(GpuMinuteRow.index) == index)
    stmt = sa.select(
        sa.func.coalesce(sa.func.sum(sa.case((observed, 1), else_=0)), 0),
        sa.func.coalesce(sa.func.sum(sa.case((busy, 1), else_=0)), 0),
        sa.func.coalesce(
            sa.func.sum(sa.case((observed, col(GpuMinuteRow.util_avg_pct)), else_=0.0)), 0.0
        ),
    ).where(*here, col(GpuMinuteRow.minute) >= _minute(start), col(GpuMinuteRow.minute) < end)
    seen, worked, util = session.connection().execute(stmt).one()
    observed_s, busy_s, util_s = (
        int(seen) * MINUTE_S,
        int(worked) * MINUTE_S,
        float(util) * MINUTE_S,
    )
    for at in {_minute(start), _minute(end)}:
        inside = (min(end, at + _ONE_MINUTE) - max(start, at)).total_seconds()
        if not 0 < inside < MINUTE_S:
            continue
        row = (
            session.connection()
            .execute(
                sa.select(col(GpuMinuteRow.ok_samples), col(GpuMinuteRow.util_avg_pct)).where(
                    *here, col(GpuMinuteRow.minute) == at
                )
            )
            .first()
        )
        if row is None or not row[0] or row[1] is None:
            continue
        cut = MINUTE_S - inside
        observed_s -= cut
        busy_s -= cut if row[1] >= busy_pct else 0.0
        util_s -= float(row[1]) * cut
    return round(observed_s, 3), round(busy_s, 3), util_s


_ONE_MINUTE = timedelta(minutes=1)


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)
