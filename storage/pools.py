"""Pools: the lock that serialises decisions in one pool, and what the pool holds right now.
Callers own the session (and so the transaction).
"""

from __future__ import annotations

from sqlmodel import Session, select

from rules.facts import PoolUsage
from storage import audit
from storage.db import lock_for_update
from storage.gpus import FreeGpus, free_gpus
from storage.requests import held_now, queued_count
from storage.tables import PoolRow


def every_pool(session: Session) -> list[PoolRow]:
    """Every stored pool, in the order the database keeps them."""
    return list(session.exec(select(PoolRow)).all())


def lock(session: Session, pool: str) -> None:
    """Serialise decisions in one pool: quota and free GPUs are read, then changed.

    On SQLite every write transaction already holds the database's one write lock. On
    PostgreSQL the audit chain's head is locked first: a decision appends to the chain after it
    locks its pool, and a release locks the pool (to serve the queue) after it appended, so
    taking the head first keeps every such pair of transactions in one lock order."""
    if session.get_bind().dialect.name == "sqlite":
        return
    audit.hold_head(session)
    session.exec(lock_for_update(session, select(PoolRow).where(PoolRow.name == pool))).one()


def pool_usage(session: Session, pool: str, free: FreeGpus | None = None) -> PoolUsage:
    """GPUs held per team, free GPUs and waiting requests in one pool, right now (`free`:
    the pool's free GPUs when the caller already read them in this transaction)."""
    held = dict(held_now(session, pool))
    queued = queued_count(session, pool)
    count = (free if free is not None else free_gpus(session, pool)).count()
    return PoolUsage(held=held, free=count, queued=queued)
