"""GPU history in the database: per-minute rollups stored, read back for reports, and pruned
after the retention period. Callers own the session (and so the transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlmodel import Session, col, select

from storage.tables import GpuMinuteRow


def store_minutes(session: Session, rows: Sequence[GpuMinuteRow]) -> int:
    """Insert `rows`, skipping any (node, index, minute) already stored (a rollup retried after
    a failed commit, or two bot processes overlapping in a restart). Returns how many went in."""
    if not rows:
        return 0
    minutes = {row.minute for row in rows}
    stored = session.exec(
        select(GpuMinuteRow.node, GpuMinuteRow.index, GpuMinuteRow.minute).where(
            col(GpuMinuteRow.minute).in_(minutes)
        )
    ).all()
    seen = {(node, index, minute) for node, index, minute in stored}
    fresh = []
    for row in rows:
        key = (row.node, row.index, row.minute)
        if key not in seen:
            seen.add(key)
            fresh.append(row)
    session.add_all(fresh)
    session.flush()
    return len(fresh)


def minutes(
    session: Session,
    node: str,
    since: datetime,
    until: datetime,
    index: int | None = None,
) -> list[GpuMinuteRow]:
    """The stored minutes of `node` (one GPU of it with `index`) in [since, until), in order."""
    query = select(GpuMinuteRow).where(
        GpuMinuteRow.node == node,
        col(GpuMinuteRow.minute) >= since,
        col(GpuMinuteRow.minute) < until,
    )
    if index is not None:
        query = query.where(GpuMinuteRow.index == index)
    ordered = query.order_by(col(GpuMinuteRow.index), col(GpuMinuteRow.minute))
    return list(session.exec(ordered).all())


def prune(session: Session, older_than: datetime) -> int:
    """Delete the minutes before `older_than` (the retention job); returns how many."""
    result = session.execute(sa.delete(GpuMinuteRow).where(col(GpuMinuteRow.minute) < older_than))
    return int(cast(Any, result).rowcount or 0)
