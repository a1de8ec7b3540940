"""Nodes: the configured machines, their GPUs as rows, and each device's lifecycle events.

Reads only; callers own the session (and so the transaction).
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from rules.domain import GpuState
from storage.tables import DeviceEventRow, GpuRow, LeaseGpuRow, LeaseRow, NodeRow


def named(session: Session, name: str) -> NodeRow | None:
    """The node called `name` (None: no such node)."""
    return session.exec(select(NodeRow).where(NodeRow.name == name)).first()


def node(session: Session, name: str) -> NodeRow:
    """The node called `name`, which the caller knows is stored (raises when it is not)."""
    return session.exec(select(NodeRow).where(NodeRow.name == name)).one()


def every_node(session: Session) -> list[NodeRow]:
    """Every stored node, in the order the database keeps them."""
    return list(session.exec(select(NodeRow)).all())


def nodes(session: Session, name: str | None = None) -> list[NodeRow]:
    """Every node (or the one called `name`), by name."""
    stmt = select(NodeRow).order_by(col(NodeRow.name))
    if name is not None:
        stmt = stmt.where(NodeRow.name == name)
    return list(session.exec(stmt).all())


def pools_of_nodes(session: Session) -> dict[str, str]:
    """Each node's pool: {node name: pool}."""
    return dict(session.exec(select(NodeRow.name, NodeRow.pool)).all())


def gpus_by_index(session: Session, node_id: int | None) -> list[GpuRow]:
    """The node's GPUs, by index."""
    stmt = select(GpuRow).where(GpuRow.node_id == node_id).order_by(col(GpuRow.index))
    return list(session.exec(stmt).all())


def gpus_of(session: Session, node_id: int | None) -> list[GpuRow]:
    """The node's GPUs, in the order the database keeps them."""
    return list(session.exec(select(GpuRow).where(GpuRow.node_id == node_id)).all())


def unhealthy_gpus(session: Session, node_id: int | None) -> list[GpuRow]:
    """The node's GPUs taken out of service as unhealthy."""
    stmt = select(GpuRow).where(GpuRow.node_id == node_id, GpuRow.state == GpuState.UNHEALTHY)
    return list(session.exec(stmt).all())


def events(
    session: Session,
    name: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> list[DeviceEventRow]:
    """Lifecycle events, oldest first (the newest `limit` when given)."""
    stmt = select(DeviceEventRow).order_by(col(DeviceEventRow.id).desc())
    if name is not None:
        stmt = stmt.where(DeviceEventRow.node == name)
    if since is not None:
        stmt = stmt.where(DeviceEventRow.at >= since)
    if limit is not None:
        stmt = stmt.limit(limit)
    return list(reversed(session.exec(stmt).all()))


def holdings(session: Session) -> list[tuple[str, int, str, LeaseRow, datetime | None]]:
    """Every lease on every GPU it holds or held: (node, index, the GPU's pool, lease, when the
    lease gave the GPU back while it ran on; None: it held it to its end, or holds it still)."""
    rows = session.exec(
        select(NodeRow.name, GpuRow, LeaseGpuRow, LeaseRow)
        .join(GpuRow, col(GpuRow.node_id) == col(NodeRow.id))
        .join(LeaseGpuRow, col(LeaseGpuRow.gpu_id) == col(GpuRow.id))
        .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
    ).all()
    return [(node, gpu.index, gpu.pool, lease, held.released_at) for node, gpu, held, lease in rows]
