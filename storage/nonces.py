"""The nonces node agents have spent: many recorded in one statement, a nonce spent before left
as it was and named as a replay; the expired ones pruned a bounded number at a time, so that no
prune holds the write lock for long.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from storage.tables import AgentNonceRow

_TABLE = AgentNonceRow.__table__  # type: ignore[attr-defined]
PRUNE_ROWS = 2_000  # expired rows deleted by one statement
# Built once per dialect: every push runs it.
_INSERTS: dict[str, Any] = {}


def _insert(dialect: str) -> Any:
    if dialect not in _INSERTS:
        insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_TABLE)
        _INSERTS[dialect] = insert.on_conflict_do_nothing(
            index_elements=["node", "nonce"]
        ).returning(_TABLE.c.node, _TABLE.c.nonce)
    return _INSERTS[dialect]


def spend(
    connection: Connection, nonces: Sequence[tuple[str, str, datetime]]
) -> set[tuple[str, str]]:
    """Record each (node, nonce, expires_at) not recorded before, in the caller's transaction;
    the (node, nonce) pairs recorded now. A pair missing from the answer was spent before."""
    if not nonces:
        return set()
    rows: list[dict[str, Any]] = [
        {"node": node, "nonce": nonce, "expires_at": expires_at}
        for node, nonce, expires_at in nonces
    ]
    # Many rows go as one INSERT .. VALUES (..), (..) RETURNING (SQLAlchemy's
    # "insertmanyvalues"); a row skipped for its conflict returns nothing.
    found = connection.execute(_insert(connection.dialect.name), rows)
    return {(row.node, row.nonce) for row in found}


def prune(connection: Connection, now: datetime, *, limit: int = PRUNE_ROWS) -> int:
    """Delete at most `limit` nonces that expired before `now`; how many went."""
    expired = sa.select(_TABLE.c.id).where(_TABLE.c.expires_at < now).limit(limit)
    result = connection.execute(sa.delete(_TABLE).where(_TABLE.c.id.in_(expired)))
    return int(result.rowcount)
