"""The sweep's own read of every GPU (storage.sweep_reads) says what storage.gpus says: the
inventory state, the node's drain, and the one active lease, never an ended one."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import col, select

from bot.services.inventory import sync_inventory
from storage import gpus, sweep_reads
from storage.db import Database
from storage.tables import GpuRow, NodeRow
from tests.builders import default_policy
from tests.unit.storage.builders import a_lease

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def test_the_sweep_sees_every_gpu_as_placement_does(database: Database) -> None:
    with database.write() as session:
        sync_inventory(session, default_policy(), at=NOW, actor="test")
        ids = [i for i in session.exec(select(GpuRow.id).order_by(col(GpuRow.id))) if i]
        assert len(ids) > 8
        a_lease(session, at=NOW, gpu_ids=ids[:2])
        a_lease(session, at=NOW, gpu_ids=ids[2:3], state="released")  # ended: not held
        a_lease(session, at=NOW, gpu_ids=ids[2:4])  # the same GPU, held again
        broken = session.get(GpuRow, ids[5])
        assert broken is not None
        broken.state = "unhealthy"
        node = session.get(NodeRow, broken.node_id)
        assert node is not None
        node.drained = True
    with database.read() as session:
        expected, actual = gpus.gpu_snapshots(session), sweep_reads.gpu_snapshots(session)
    assert expected == actual
    held = {g.id: g.lease_id for g in actual if g.lease_id is not None}
    assert set(ids[:4]) == held.keys()
    assert any(g.drained for g in actual)
    assert "unhealthy" == next(g.state for g in actual if g.id == ids[5])
