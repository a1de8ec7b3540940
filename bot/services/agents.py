"""The node agents' use cases: spend a request's nonce durably (so a replay is refused even
after a restart) and keep refused agent requests in the audit log without letting a sender
flood it (one aggregated `agent:refused` row per node per window).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import col

from bot.services.context import SYSTEM, Context, record
from storage.audit import AuditTag
from storage.db import Database
from storage.tables import AgentNonceRow

PRUNE_EVERY = timedelta(minutes=1)
REFUSED_WINDOW = timedelta(minutes=10)
MAX_REASONS = 8  # distinct reasons kept per row; the count covers the rest


@dataclass(slots=True)
class _Refused:
    last_row: datetime | None = None
    count: int = 0  # refusals since the last row
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class _Book:
    """What the agents' use cases keep in memory for one database: when spent nonces were
    last pruned, and the refusals of each node since its last audit row."""

    pruned: datetime | None = None
    refused: dict[str, _Refused] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_books: weakref.WeakKeyDictionary[Database, _Book] = weakref.WeakKeyDictionary()
_books_lock = threading.Lock()


def _book(ctx: Context) -> _Book:
    with _books_lock:
        book = _books.get(ctx.db)
        if book is None:
            book = _books[ctx.db] = _Book()
        return book


def spend_nonce(ctx: Context, node: str, nonce: str, expires_at: datetime) -> bool:
    """Record `nonce` of `node` as spent until `expires_at`; False when it was spent before
    (a replay). At most once a minute, the nonces past their expiry go first."""
    now = ctx.now()
    book = _book(ctx)
    with book.lock:
        prune = book.pruned is None or now - book.pruned >= PRUNE_EVERY
        if prune:
            book.pruned = now
    if prune:
        with ctx.db.write() as session:
            session.execute(sa.delete(AgentNonceRow).where(col(AgentNonceRow.expires_at) < now))
    try:
        with ctx.db.write() as session:
            session.add(AgentNonceRow(node=node, nonce=nonce, expires_at=expires_at))
    except IntegrityError:  # the unique (node, nonce): spent before
        return False
    return True


def record_refused(ctx: Context, node: str, why: str) -> bool:
    """Note a refused request of the known node `node`; write an `agent:refused` row only when
    the node has none from the last REFUSED_WINDOW, carrying every refusal since its last row
    (count and reasons). True when a row was written."""
    now = ctx.now()
    book = _book(ctx)
    with book.lock:
        seen = book.refused.setdefault(node, _Refused())
        seen.count += 1
        reason = why[:200]
        if reason in seen.reasons or len(seen.reasons) < MAX_REASONS:
            seen.reasons[reason] += 1
        if seen.last_row is not None and now - seen.last_row < REFUSED_WINDOW:
            return False
        count, reasons = seen.count, dict(seen.reasons.most_common())
        book.refused[node] = _Refused(last_row=now)
    with ctx.db.write() as session:
        record(
            session,
            at=now,
            # The bot, not the node: nothing the sender claimed was proven.
            actor=SYSTEM,
            tag=AuditTag.AGENT_REFUSED,
            subject=f"node:{node}"[:64],
            outcome="refused",
            detail={
                "why": reason,
                "count": count,
                "reasons": reasons,
                "window_s": int(REFUSED_WINDOW.total_seconds()),
            },
        )
    return True
