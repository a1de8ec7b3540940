"""Enforcement orders: the ones waiting for a node's agent, and one order, locked for a change.
Callers own the session (and so the transaction).
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from storage.db import lock_for_update
from storage.tables import EnforcementRow


def lock_waiting_for(session: Session, node: str, state: str) -> list[EnforcementRow]:
    """The node's orders in `state` (those not yet handed over), oldest first, locked."""
    stmt = (
        select(EnforcementRow)
        .where(EnforcementRow.node == node, EnforcementRow.state == state)
        .order_by(col(EnforcementRow.id))
    )
    return list(session.exec(lock_for_update(session, stmt)).all())


def lock(session: Session, order_id: int) -> EnforcementRow | None:
    """The order, locked for a change (None: there is no such order)."""
    stmt = select(EnforcementRow).where(EnforcementRow.id == order_id)
    return session.exec(lock_for_update(session, stmt)).first()
