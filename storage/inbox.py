"""The durable inbox: every Slack request the bot acknowledges, recorded before its ack.

`accept` is the ack path's one short insert; a key seen before (Slack's retry, a replay) answers
None and nothing is recorded twice. A worker `take`s a row, marking it done, inside the unit of
work that carries it out, so its effects, its answer and the mark commit together, exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from storage.db import skip_locked
from storage.tables import InboxRow

PENDING, DONE, FAILED = "pending", "done", "failed"
_MAX_BACKOFF = timedelta(minutes=1)
KEPT = timedelta(days=2)  # longer than any retry or replay Slack could still send


_TABLE = InboxRow.__table__  # type: ignore[attr-defined]
# Built once: the ack path and the workers run these for every request.
_INSERTS: dict[str, Any] = {}
_TAKE = (
    sa.update(_TABLE)
    .where(_TABLE.c.id == sa.bindparam("row_id"), _TABLE.c.state == PENDING)
    .values(state=DONE, done_at=sa.bindparam("at"), attempts=_TABLE.c.attempts + 1)
)
# PostgreSQL: a row another replica's worker is carrying out (locked by its unit of work) is
# passed over at once instead of waited for; that worker commits it or leaves it for a retry.
_TAKE_UNLOCKED = _TAKE.where(
    _TABLE.c.id.in_(
        sa.select(_TABLE.c.id)
        .where(_TABLE.c.id == sa.bindparam("row_id"))
        .with_for_update(skip_locked=True)
    )
)


def _insert(dialect: str) -> Any:
    if dialect not in _INSERTS:
        insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_TABLE)
        _INSERTS[dialect] = insert.on_conflict_do_nothing(index_elements=["key"]).returning(
            _TABLE.c.id
        )
    return _INSERTS[dialect]


def accept(
    session: Session,
    *,
    key: str,
    kind: str,
    actor: str,
    payload: Mapping[str, Any],
    at: datetime,
) -> int | None:
    """Record one request; its id, or None when its key was recorded before."""
    values = {
        "key": key,
        "received_at": at,
        "kind": kind,
        "actor": actor,
        "payload": dict(payload),
        "state": PENDING,
        "attempts": 0,
        "next_attempt_at": at,
        "last_error": "",
    }
    found = session.execute(_insert(session.get_bind().dialect.name), values).first()
    return int(found[0]) if found is not None else None


def take(session: Session, row_id: int, *, at: datetime) -> bool:
    """Mark the row done in the caller's unit of work, which carries it out: the mark commits
    with the request's effects or not at all. False when it no longer waits (an earlier run
    finished it, or another replica is carrying it out right now); on PostgreSQL the row stays
    locked until the unit of work ends."""
    postgres = session.get_bind().dialect.name == "postgresql"
    result = session.execute(_TAKE_UNLOCKED if postgres else _TAKE, {"row_id": row_id, "at": at})
    return bool(result.rowcount)  # type: ignore[attr-defined]


def failed(session: Session, row_id: int, *, at: datetime, error: str) -> None:
    """Given up: the person has been told (with a reference) in the same transaction."""
    session.execute(
        sa.update(InboxRow)
        .where(col(InboxRow.id) == row_id, col(InboxRow.state) == PENDING)
        .values(state=FAILED, done_at=at, last_error=error[:500])
    )


def retry_later(session: Session, row_id: int, *, at: datetime, error: str) -> datetime:
    """Count a failed attempt and push the next one back (doubling, at most a minute)."""
    row = session.get(InboxRow, row_id)
    if row is None or row.state != PENDING:
        return at
    row.attempts += 1
    backoff = min(_MAX_BACKOFF, timedelta(seconds=2 ** min(row.attempts, 8)))
    row.next_attempt_at, row.last_error = at + backoff, error[:500]
    session.add(row)
    return row.next_attempt_at


def due(
    session: Session, now: datetime, limit: int = 500, *, received_before: datetime | None = None
) -> list[tuple[int, str]]:
    """(id, actor) of the waiting rows whose next attempt has come, in arrival order.
    `received_before`: only rows that arrived before then (a replica leaves the rows another
    one acknowledged just now to it). On PostgreSQL a row being carried out is passed over."""
    stmt = (
        select(InboxRow.id, InboxRow.actor)
        .where(InboxRow.state == PENDING, col(InboxRow.next_attempt_at) <= now)
        .order_by(col(InboxRow.id))
        .limit(limit)
    )
    if received_before is not None:
        stmt = stmt.where(col(InboxRow.received_at) < received_before)
    rows = session.exec(skip_locked(session, stmt)).all()
    return [(int(i), str(a)) for i, a in rows if i is not None]


def backlog(session: Session) -> int:
    """How many acknowledged requests are not carried out yet."""
    stmt = select(sa.func.count()).select_from(InboxRow).where(InboxRow.state == PENDING)
    return int(session.exec(stmt).one())


def prune(session: Session, before: datetime) -> int:
    """Forget finished rows received before `before` (their keys cannot come back by then)."""
    result = session.execute(
        sa.delete(InboxRow).where(
            col(InboxRow.state) != PENDING, col(InboxRow.received_at) < before
        )
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
