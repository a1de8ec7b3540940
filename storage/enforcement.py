"""Enforcement orders: the ones waiting for a node's agent or for the scheduler step, and one
order, locked for a change; and the node drains waiting to be carried out in the scheduler
(rows of the `setting` table under `enforce:drain:<node>`, the value a small JSON object).
Callers own the session (and so the transaction).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session, col, select

from storage.db import lock_for_update
from storage.tables import EnforcementRow, SettingRow

_DRAIN = "enforce:drain:"
_KEY_MAX, _VALUE_MAX = 64, 256  # SettingRow's columns


def lock_waiting_for(session: Session, node: str, state: str) -> list[EnforcementRow]:
    """The node's orders in `state` (those not yet handed over), oldest first, locked."""
    stmt = (
        select(EnforcementRow)
        .where(EnforcementRow.node == node, EnforcementRow.state == state)
        .order_by(col(EnforcementRow.id))
    )
    return list(session.exec(lock_for_update(session, stmt)).all())


def waiting(session: Session, state: str) -> list[EnforcementRow]:
    """Every order in `state`, whatever its node, oldest first (not locked: a read)."""
    stmt = select(EnforcementRow).where(EnforcementRow.state == state)
    return list(session.exec(stmt.order_by(col(EnforcementRow.id))).all())


def lock(session: Session, order_id: int) -> EnforcementRow | None:
    """The order, locked for a change (None: there is no such order)."""
    stmt = select(EnforcementRow).where(EnforcementRow.id == order_id)
    return session.exec(lock_for_update(session, stmt)).first()


@dataclass(frozen=True)
class Drain:
    """A node drain the scheduler has yet to carry out, and how often it failed so far."""

    node: str
    reason: str
    tries: int = 0


def _drain_key(node: str) -> str:
    key = f"{_DRAIN}{node}"
    if len(key) <= _KEY_MAX:
        return key
    return f"{_DRAIN}#{hashlib.sha256(node.encode()).hexdigest()[:32]}"  # the node is in the value


def want_drain(session: Session, drain: Drain, *, at: datetime, by: str) -> None:
    """Keep `drain` until the scheduler step carried it out (replacing one waiting for the
    node); the reason is shortened until the row holds it."""
    reason = drain.reason
    value = json.dumps({"node": drain.node, "reason": reason, "tries": drain.tries})
    while len(value) > _VALUE_MAX and reason:
        reason = reason[: max(0, len(reason) - (len(value) - _VALUE_MAX) - 3)].rstrip()
        value = json.dumps({"node": drain.node, "reason": f"{reason}...", "tries": drain.tries})
    key = _drain_key(drain.node)
    row = session.get(SettingRow, key) or SettingRow(key=key, value=value, updated_by=by)
    row.value, row.updated_at, row.updated_by = value, at, by[:64]
    session.add(row)


def drains(session: Session) -> list[Drain]:
    """The drains waiting, by node name."""
    stmt = select(SettingRow.value).where(col(SettingRow.key).startswith(_DRAIN))
    found = [json.loads(value) for value in session.exec(stmt).all()]
    return sorted(
        (Drain(str(d["node"]), str(d.get("reason", "")), int(d.get("tries", 0))) for d in found),
        key=lambda d: d.node,
    )


def drop_drain(session: Session, node: str) -> None:
    """The node's drain is carried out or given up: it no longer waits."""
    row = session.get(SettingRow, _drain_key(node))
    if row is not None:
        session.delete(row)
