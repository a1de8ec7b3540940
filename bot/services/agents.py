"""The node agents' use cases: spend a request's nonce durably (so a replay is refused even
after a restart), the nonces of pushes arriving together in one transaction, and keep refused
agent requests in the audit log without letting a sender flood it (one aggregated
`agent:refused` row per node per window).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from bot.services.context import SYSTEM, Context, record
from storage import nonces
from storage.audit import AuditTag
from storage.db import Database

PRUNE_EVERY = timedelta(minutes=1)
MAX_BATCH = 256  # nonces in one transaction; more wait for the next one
REFUSED_WINDOW = timedelta(minutes=10)
MAX_REASONS = 8  # distinct reasons kept per row; the count covers the rest


@dataclass(slots=True)
class _Refused:
    last_row: datetime | None = None
    count: int = 0  # refusals since the last row
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass(eq=False, slots=True)
class _Spend:
    """One nonce waiting to be recorded, and what became of it."""

    node: str
    nonce: str
    expires_at: datetime
    woken: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to write the next batch, not with an answer
    spent: bool = False
    error: BaseException | None = None


@dataclass(slots=True)
class _Book:
    """What the agents' use cases keep in memory for one database: when spent nonces were
    last pruned and whether expired ones are left, the nonces waiting for the transaction
    that records them, and the refusals of each node since its last audit row."""

    pruned: datetime | None = None
    expired_left: bool = False
    waiting: list[_Spend] = field(default_factory=list)
    writing: bool = False  # a thread is recording a batch; the next one is handed the lead
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
    (a replay). Answers only once the nonce is committed.

    Group commit: the nonces of pushes that arrive while a batch is being written wait, and
    the first of them writes them all in the next transaction, so a burst of pushes costs a
    few transactions instead of one each. At most once a minute, that transaction also starts
    deleting the nonces past their expiry, PRUNE_ROWS at a time, one chunk per batch until
    none are left."""
    book = _book(ctx)
    mine = _Spend(node, nonce, expires_at)
    with book.lock:
        book.waiting.append(mine)
        lead = not book.writing
        book.writing = True
    if not lead:
        mine.woken.wait()
    if mine.lead or lead:
        _write_batch(ctx, book)
    if mine.error is not None:
        raise RuntimeError(f"the nonce of {node!r} could not be recorded") from mine.error
    return mine.spent


def _write_batch(ctx: Context, book: _Book) -> None:
    """Record the waiting nonces (the caller's among them) in one transaction, answer each,
    and hand the lead to the first that came in meanwhile."""
    with book.lock:
        batch, book.waiting = book.waiting[:MAX_BATCH], book.waiting[MAX_BATCH:]
    answered = False
    try:
        _record(ctx, book, batch)
        answered = True
    except Exception as exc:  # each push of the batch answers 503, and its agent retries
        for one in batch:
            one.error = exc
        answered = True
    finally:
        if not answered:  # interrupted: the others must not wait forever, nor hear "replay"
            for one in batch:
                one.error = RuntimeError("the batch was interrupted")
        with book.lock:
            following = book.waiting[0] if book.waiting else None
            if following is not None:
                following.lead = True
            else:
                book.writing = False
        for one in batch:
            one.woken.set()
        if following is not None:
            following.woken.set()


def _record(ctx: Context, book: _Book, batch: list[_Spend]) -> None:
    now = ctx.now()
    with book.lock:
        if book.pruned is None or now - book.pruned >= PRUNE_EVERY:
            book.pruned, book.expired_left = now, True
        prune = book.expired_left
    # A nonce twice in one batch: the first spends it, the others are replays.
    first: dict[tuple[str, str], _Spend] = {}
    for one in batch:
        first.setdefault((one.node, one.nonce), one)
    left = False
    with ctx.db.begin() as connection:
        if prune:
            left = nonces.prune(connection, now) >= nonces.PRUNE_ROWS
        recorded = nonces.spend(
            connection, [(one.node, one.nonce, one.expires_at) for one in first.values()]
        )
    if prune:
        with book.lock:
            book.expired_left = left
    for key, one in first.items():
        one.spent = key in recorded


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
