"""The transactional outbox: owe a message inside a decision's transaction, then deliver it.

`owe` runs in the caller's transaction. `due` hands the delivery worker what is ready, oldest
first; `delivered` and `failed` record the outcome. Failed rows stay pending with a backoff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session, col, select

from storage.tables import OutboxRow

PENDING, DELIVERED, DROPPED = "pending", "delivered", "dropped"
_MAX_BACKOFF = timedelta(minutes=5)


@dataclass(frozen=True)
class Owed:
    """One message someone is owed: its kind, what it is about, and to whom."""

    kind: str
    subject: str
    recipient: str
    data: Mapping[str, Any]


def owe(session: Session, message: Owed, *, at: datetime) -> OutboxRow:
    row = OutboxRow(
        created_at=at,
        kind=message.kind,
        subject=message.subject,
        recipient=message.recipient,
        data=dict(message.data),
        next_attempt_at=at,
    )
    session.add(row)
    session.flush()
    return row


def due(session: Session, now: datetime, limit: int = 50) -> list[OutboxRow]:
    """Pending rows whose next attempt has come, in the order they were owed."""
    stmt = (
        select(OutboxRow)
        .where(OutboxRow.state == PENDING, col(OutboxRow.next_attempt_at) <= now)
        .order_by(col(OutboxRow.id))
        .limit(limit)
    )
    return list(session.exec(stmt).all())


def delivered(
    session: Session, row_id: int, *, at: datetime, channel: str | None, ts: str | None
) -> None:
    row = session.get(OutboxRow, row_id)
    assert row is not None
    row.state, row.delivered_at, row.channel, row.ts = DELIVERED, at, channel, ts
    row.attempts += 1
    session.add(row)


def failed(session: Session, row_id: int, *, at: datetime, error: str) -> datetime:
    """Keep the row pending and push its next attempt back (doubling, at most 5 minutes)."""
    row = session.get(OutboxRow, row_id)
    assert row is not None
    row.attempts += 1
    backoff = min(_MAX_BACKOFF, timedelta(seconds=2 ** min(row.attempts, 10)))
    row.next_attempt_at, row.last_error = at + backoff, error[:500]
    session.add(row)
    return row.next_attempt_at


def dropped(session: Session, row_id: int, *, at: datetime, why: str) -> None:
    """Nothing is left to deliver (e.g. a card update for a card that was never posted)."""
    row = session.get(OutboxRow, row_id)
    assert row is not None
    row.state, row.delivered_at, row.last_error = DROPPED, at, why[:500]
    session.add(row)


def landed(session: Session, subject: str, kinds: Sequence[str]) -> list[OutboxRow]:
    """Where the messages of these kinds about `subject` landed (delivered ones only)."""
    stmt = (
        select(OutboxRow)
        .where(
            OutboxRow.subject == subject,
            col(OutboxRow.kind).in_(list(kinds)),
            OutboxRow.state == DELIVERED,
        )
        .order_by(col(OutboxRow.id))
    )
    return list(session.exec(stmt).all())


def owed_about(session: Session, subject: str) -> list[OutboxRow]:
    stmt = select(OutboxRow).where(OutboxRow.subject == subject).order_by(col(OutboxRow.id))
    return list(session.exec(stmt).all())
