"""A person's recent use: the GPU-minutes their leases held in a window, and of those the
minutes the per-minute history saw, and saw busy."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session, col, select

from storage.tables import GpuMinuteRow, GpuRow, LeaseGpuRow, LeaseRow, NodeRow


@dataclass(frozen=True)
class HeldMinutes:
    """GPU-minutes held in a window; `observed`: those with a working reading; `busy`: those
    whose average utilisation reached the busy threshold."""

    held: float
    observed: int
    busy: int


def held_minutes(
    session: Session, holder: str, since: datetime, until: datetime, *, busy_pct: float
) -> HeldMinutes:
    """What `holder`'s leases held in [since, until): each GPU from its lease's grant to its
    end, or to when the lease gave it back (or `until` while it runs), read against the stored
    minutes of that GPU."""
    stmt = (
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
    held, observed, busy = 0.0, 0, 0
    for node, index, lease, held_gpu in session.exec(stmt).all():
        ended_at = held_gpu.released_at or lease.ended_at
        start, end = max(lease.granted_at, since), min(ended_at or until, until)
        if end <= start:
            continue
        held += (end - start).total_seconds() / 60
        seen, worked = _minutes(session, node, index, start, end, busy_pct=busy_pct)
        observed += seen
        busy += worked
    return HeldMinutes(held, observed, busy)


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
