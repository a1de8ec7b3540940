"""Keeping the pools, nodes and GPUs of the database in step with the rule files."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, select

from bot.services import device_records
from bot.services.context import record
from rules.policy import Policy
from storage.tables import GpuRow, NodeRow, PoolRow


def sync_inventory(session: Session, policy: Policy, *, at: datetime, actor: str) -> list[str]:
    """Create the pools, nodes and GPUs the policy names; return what changed.

    Nothing is deleted: a node that left the policy keeps its history and is drained instead.
    """
    changes: list[str] = []
    pools = {p.name: p for p in session.exec(select(PoolRow)).all()}
    for pool in policy.pools.values():
        row = pools.get(pool.name)
        if row is None:
            session.add(PoolRow(name=pool.name, model=pool.model, protected=pool.protected))
            changes.append(f"pool {pool.name} added")
        elif (row.model, row.protected) != (pool.model, pool.protected):
            row.model, row.protected = pool.model, pool.protected
            session.add(row)
            changes.append(f"pool {pool.name} updated")
    session.flush()  # nodes refer to pools; no relationships order the inserts for us
    nodes = {n.name: n for n in session.exec(select(NodeRow)).all()}
    wanted = {node: pool for pool in policy.pools.values() for node in pool.nodes}
    for name, pool in wanted.items():
        node = nodes.get(name)
        if node is None:
            node = NodeRow(name=name, pool=pool.name)
            session.add(node)
            session.flush()
            changes.append(f"node {name} added to {pool.name}")
        elif node.pool != pool.name:
            node.pool = pool.name
            session.add(node)
            changes.append(f"node {name} moved to {pool.name}")
        assert node.id is not None
        have = {g.index: g for g in session.exec(select(GpuRow).where(GpuRow.node_id == node.id))}
        for index in range(pool.nodes[name]):
            gpu = have.get(index)
            if gpu is None:
                session.add(GpuRow(node_id=node.id, index=index, model=pool.model, pool=pool.name))
                changes.append(f"{name} GPU {index} added")
                device_records.event(
                    session, at, name, index, "joined", actor=actor, pool=pool.name
                )
            elif gpu.pool != pool.name:
                gpu.pool = pool.name
                session.add(gpu)
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
            tag="inventory:synced",
            subject="inventory",
            detail={"changes": changes, "revision": policy.revision},
        )
    return changes
