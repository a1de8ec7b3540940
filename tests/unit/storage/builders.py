"""Rows the storage tests start from, written the way the bot writes them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlmodel import Session

from rules.marks import Marks
from storage.tables import LeaseGpuRow, LeaseRow


def a_lease(
    session: Session,
    *,
    at: datetime,
    lasts: timedelta = timedelta(hours=6),
    gpu_ids: Sequence[int] = (),
    holder: str = "U1",
    team: str = "vision",
    state: str = "active",
    marks: Marks | None = None,
) -> int:
    """A lease of pool a100 granted `at` for `lasts`, on `gpu_ids` (their lease_gpu rows)."""
    lease = LeaseRow(
        holder=holder,
        team=team,
        pool="a100",
        gpus=len(gpu_ids) or 1,
        state=state,
        granted_at=at,
        expires_at=at + lasts,
        warnings=marks or Marks(),
    )
    session.add(lease)
    session.flush()
    assert lease.id is not None
    for gpu_id in gpu_ids:
        session.add(LeaseGpuRow(lease_id=lease.id, gpu_id=gpu_id, active=state == "active"))
    session.flush()
    return lease.id
