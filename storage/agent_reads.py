"""What the agent ingest reads on its own: which nodes have enforcement orders waiting."""

from __future__ import annotations

from sqlmodel import select

from storage.db import Database
from storage.tables import EnforcementRow

WAITING = "pending"  # bot.services.enforcement.PENDING: written, not yet handed to an agent


def nodes_with_orders(db: Database) -> frozenset[str]:
    """The nodes with at least one order no agent has carried away yet (one short read, so a
    push from any other node needs no transaction to learn it has none)."""
    with db.read() as session:
        stmt = select(EnforcementRow.node).where(EnforcementRow.state == WAITING).distinct()
        return frozenset(session.exec(stmt).all())
