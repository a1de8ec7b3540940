"""Keeping the pools, nodes and GPUs of the database in step with the rule files."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from bot.services import device_records
from bot.services.context import record
from rules.policy import Policy, Pool
from storage import nodes as storage_nodes
from storage import pools as storage_pools
from storage.audit import AuditTag
from storage.tables import GpuRow, NodeRow, PoolRow


def sync_inventory(session: Session, policy: Policy, *, at: datetime, actor: str) -> list[str]:
    """Create the pools, nodes and GPUs the policy names; return what changed.

    Nothing is deleted: a node that left the policy keeps its history and is drained instead.
    """
    changes = _sync_pools(session, policy)
    session.flush()  # nodes refer to pools; no relationships order the inserts for us
    nodes = {n.name: n for n in storage_nodes.every_node(session)}
    wanted = {node: pool for pool in policy.pools.values() for node in pool.nodes}
    for name, pool in wanted.items():
        node = _sync_node(session, nodes.get(name), name, pool, changes)
        _sync_gpus(session, node, pool, changes, at=at, actor=actor)
    for name, node in nodes.items():
        if name not in wanted and not node.drained:
            node.drained = True
            session.add(node)
            changes.append(f"node {name} left the rule files and was drained")
            device_records.event(session, at, name, None, "left", actor=actor)
    if changes:
        session.flush()
        record(
            session,
            at=at,
            actor=actor,
            tag=AuditTag.INVENTORY_SYNCED,
            subject="inventory",
            detail={"changes": changes, "revision": policy.revision},
        )
    return changes


def _sync_pools(session: Session, policy: Policy) -> list[str]:
    changes = []
    pools = {p.name: p for p in storage_pools.every_pool(session)}
    for pool in policy.pools.values():
        row = pools.get(pool.name)
        if row is None:
            session.add(PoolRow(name=pool.name, model=pool.model, protected=pool.protected))
            changes.append(f"pool {pool.name} added")
        elif (row.model, row.protected) != (pool.model, pool.protected):
            row.model, row.protected = pool.model, pool.protected
            session.add(row)
            changes.append(f"pool {pool.name} updated")
    return changes


def _sync_node(
    session: Session, node: NodeRow | None, name: str, pool: Pool, changes: list[str]
) -> NodeRow:
    """The node as the policy has it: created, or moved to its pool."""
    if node is None:
        node = NodeRow(name=name, pool=pool.name)
        session.add(node)
        session.flush()
        changes.append(f"node {name} added to {pool.name}")
    elif node.pool != pool.name:
        node.pool = pool.name
        session.add(node)
        changes.append(f"node {name} moved to {pool.name}")
    return node


def _sync_gpus(
    session: Session, node: NodeRow, pool: Pool, changes: list[str], *, at: datetime, actor: str
) -> None:
    """The node's GPUs as the policy counts them: the missing ones join, all in its pool."""
    assert node.id is not None
    have = {g.index: g for g in storage_nodes.gpus_of(session, node.id)}
    for index in range(pool.nodes[node.name]):
        gpu = have.get(index)
        if gpu is None:
            session.add(GpuRow(node_id=node.id, index=index, model=pool.model, pool=pool.name))
            changes.append(f"{node.name} GPU {index} added")
            device_records.event(
                session, at, node.name, index, "joined", actor=actor, pool=pool.name
            )
        elif gpu.pool != pool.name:
            gpu.pool = pool.name
            session.add(gpu)
