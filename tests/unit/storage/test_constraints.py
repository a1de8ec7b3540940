"""The database itself refuses what must never happen: a GPU in two active leases, two verdicts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlmodel import Session, select

from storage.db import Database
from storage.tables import (
    ApprovalRow,
    GpuRow,
    LeaseGpuRow,
    NodeRow,
    PoolRow,
    RequestRow,
)
from tests.unit.storage.builders import a_lease

NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)


def a_gpu(session: Session) -> int:
    # Flush parents first: without relationship()s the ORM does not order inserts by FK.
    session.add(PoolRow(name="a100"))
    session.flush()
    node = NodeRow(name="node-1", pool="a100")
    session.add(node)
    session.flush()
    assert node.id is not None
    gpu = GpuRow(node_id=node.id, index=0, pool="a100")
    session.add(gpu)
    session.flush()
    assert gpu.id is not None
    return gpu.id


def test_a_gpu_cannot_be_in_two_active_leases(database: Database) -> None:
    """The partial unique index refuses a second active lease on the same GPU."""
    with database.write() as session:
        gpu = a_gpu(session)
        session.add(LeaseGpuRow(lease_id=a_lease(session, at=NOW, holder="U1"), gpu_id=gpu))
    with pytest.raises(sa.exc.IntegrityError), database.write() as session:
        session.add(LeaseGpuRow(lease_id=a_lease(session, at=NOW, holder="U2"), gpu_id=gpu))
    with database.read() as session:
        assert 1 == len(session.exec(select(LeaseGpuRow)).all())


def test_a_gpu_can_be_leased_again_once_the_first_lease_is_inactive(database: Database) -> None:
    """Clearing `active` on the first lease's GPU row frees the GPU for the next lease."""
    with database.write() as session:
        gpu = a_gpu(session)
        first = a_lease(session, at=NOW, holder="U1")
        session.add(LeaseGpuRow(lease_id=first, gpu_id=gpu))
    with database.write() as session:
        ended = session.get(LeaseGpuRow, (first, gpu))
        assert ended is not None
        ended.active = False
        session.add(LeaseGpuRow(lease_id=a_lease(session, at=NOW, holder="U2"), gpu_id=gpu))
    with database.read() as session:
        rows = session.exec(select(LeaseGpuRow).order_by(sa.text("lease_id"))).all()
    assert [False, True] == [row.active for row in rows]


def test_a_request_takes_only_one_approval(database: Database) -> None:
    """A second verdict on the same request is refused, so exactly one decision wins."""
    with database.write() as session:
        request = RequestRow(
            kind="borrow",
            requester="U1",
            team="vision",
            pool="a100",
            gpus=2,
            duration_s=6 * 3600,
            state="pending",
            outcome="ask",
            created_at=NOW,
        )
        session.add(request)
        session.flush()
        assert request.id is not None
        request_id = request.id
        session.add(ApprovalRow(request_id=request_id, approver="M1", verdict="approve", at=NOW))
    with pytest.raises(sa.exc.IntegrityError), database.write() as session:
        session.add(ApprovalRow(request_id=request_id, approver="M2", verdict="deny", at=NOW))
    with database.read() as session:
        verdicts = [row.verdict for row in session.exec(select(ApprovalRow))]
    assert ["approve"] == verdicts


def test_a_gpu_must_belong_to_an_existing_node(database: Database) -> None:
    """Foreign keys are enforced on both backends (SQLite needs them switched on)."""
    with database.write() as session:
        session.add(PoolRow(name="a100"))
    with pytest.raises(sa.exc.IntegrityError), database.write() as session:
        session.add(GpuRow(node_id=404, index=0, pool="a100"))
