"""Borrow, extend and release requests: the queue in serving order, what waits where, and the
request locked for a decision. Callers own the session (and so the transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.orm import ORMExecuteState
from sqlmodel import Session, col, select

from rules.domain import RequestKind, RequestState
from rules.policy import Policy
from rules.queueing import Queued, queue_order
from storage.db import lock_for_update
from storage.leases import flushed, held_by_team
from storage.tables import OutboxRow, RequestRow

_MEMO = "gpubot.requests.memo"
T = TypeVar("T")


def per_transaction(session: Session, key: Hashable, read: Callable[[], T]) -> T:
    """`read()`, read once for `key` while the transaction changes nothing: what the queue
    reads (its requests, the teams' fair-share usage, the pool's timeline) is asked several
    times by one decision, and with a thousand requests waiting each read costs. Forgotten at
    every flush, ORM write statement and end of the transaction; with changes pending, read
    afresh (the read's autoflush then makes them count)."""
    if session.new or session.dirty or session.deleted:
        return read()
    memo: dict[Hashable, Any] | None = session.info.get(_MEMO)
    if memo is None:
        memo = session.info[_MEMO] = {}
        _forget_on_change(session, memo)
    if key not in memo:
        memo[key] = read()
    return cast(T, memo[key])


def _forget_on_change(session: Session, memo: dict[Hashable, Any]) -> None:
    def forget(*_: Any) -> None:
        memo.clear()

    def written(state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            memo.clear()

    for name in ("after_flush", "after_commit", "after_rollback", "after_soft_rollback"):
        sa.event.listen(session, name, forget)
    sa.event.listen(session, "do_orm_execute", written)


def get(session: Session, request_id: int) -> RequestRow | None:
    """The request (None: there is no such request)."""
    return session.get(RequestRow, request_id)


def listed(
    session: Session, *, open_only: bool = True, requester: str | None = None
) -> list[RequestRow]:
    """Requests, oldest first; by default only the open ones (pending or queued)."""
    stmt = select(RequestRow).order_by(col(RequestRow.id))
    if open_only:
        stmt = stmt.where(col(RequestRow.state).in_([RequestState.PENDING, RequestState.QUEUED]))
    if requester is not None:
        stmt = stmt.where(RequestRow.requester == requester)
    return list(session.exec(stmt).all())


def ids_for_lease(session: Session, lease_id: int) -> list[int]:
    """The requests that made or extended a lease."""
    stmt = select(RequestRow.id).where(RequestRow.lease_id == lease_id)
    return [request_id for request_id in session.exec(stmt).all() if request_id is not None]


def pending(session: Session) -> list[RequestRow]:
    """Every request waiting for a person's decision."""
    return list(session.exec(select(RequestRow).where(RequestRow.state == RequestState.PENDING)))


def pending_with_card(session: Session, pool: str) -> list[RequestRow]:
    """The pool's pending requests whose approval card was sent to someone."""
    stmt = select(RequestRow).where(
        RequestRow.pool == pool,
        RequestRow.state == RequestState.PENDING,
        RequestRow.approval_route != "",
    )
    return list(session.exec(stmt).all())


def cards_to_redraw(
    session: Session, pool: str, kind: str, states: list[str], besides: int | None
) -> list[int]:
    """The pool's pending requests with an approval card, but no outbox row of `kind` about
    them in one of `states` (a redraw already on its way), by id; `besides` left out. One
    read, however many requests wait."""
    subject = sa.literal("request:") + sa.cast(col(RequestRow.id), sa.String)
    on_its_way = (
        sa.select(col(OutboxRow.id))
        .where(
            col(OutboxRow.subject) == subject,
            col(OutboxRow.kind) == kind,
            col(OutboxRow.state).in_(states),
        )
        .exists()
    )
    stmt = (
        sa.select(col(RequestRow.id))
        .where(
            col(RequestRow.pool) == pool,
            col(RequestRow.state) == RequestState.PENDING,
            col(RequestRow.approval_route) != "",
            sa.not_(on_its_way),
        )
        .order_by(col(RequestRow.id))
    )
    if besides is not None:
        stmt = stmt.where(col(RequestRow.id) != besides)
    return [i or 0 for (i,) in flushed(session).execute(stmt)]


def queued_since(session: Session, pool: str, at_most: datetime) -> list[RequestRow]:
    """The pool's requests queued at `at_most` or earlier (queued when made, or when a person
    approved them)."""
    stmt = select(RequestRow).where(
        RequestRow.pool == pool,
        RequestRow.state == RequestState.QUEUED,
        sa.func.coalesce(col(RequestRow.decided_at), col(RequestRow.created_at)) <= at_most,
    )
    return list(session.exec(stmt).all())


def lock(session: Session, request_id: int) -> RequestRow | None:
    """The request, locked for a decision (None: there is no such request)."""
    stmt = select(RequestRow).where(RequestRow.id == request_id)
    return session.exec(lock_for_update(session, stmt)).first()


def any_queued(session: Session, pool: str) -> bool:
    """Does any request wait in the pool's queue?"""
    stmt = select(RequestRow.id).where(
        RequestRow.pool == pool, RequestRow.state == RequestState.QUEUED
    )
    return session.exec(stmt.limit(1)).first() is not None


def queued_sizes(session: Session, pool: str) -> list[int]:
    """The GPUs each request waiting in the pool's queue asks for."""
    stmt = select(RequestRow.gpus).where(
        RequestRow.pool == pool, RequestRow.state == RequestState.QUEUED
    )
    return list(session.exec(stmt).all())


def pending_extension(session: Session, lease_id: int) -> int | None:
    """The id of an extension of the lease still waiting for a person, if any."""
    stmt = select(RequestRow.id).where(
        RequestRow.lease_id == lease_id,
        RequestRow.kind == RequestKind.EXTEND,
        RequestRow.state == RequestState.PENDING,
    )
    return session.exec(stmt).first()


def lock_pending_extensions(session: Session, lease_id: int) -> list[RequestRow]:
    """The extensions of the lease still waiting for a person, locked."""
    stmt = select(RequestRow).where(
        RequestRow.lease_id == lease_id,
        RequestRow.kind == RequestKind.EXTEND,
        RequestRow.state == RequestState.PENDING,
    )
    return list(session.exec(lock_for_update(session, stmt)).all())


def queued_count(session: Session, pool: str) -> int:
    """How many requests wait in the pool's queue."""
    found = session.exec(
        select(sa.func.count())
        .select_from(RequestRow)
        .where(RequestRow.pool == pool, RequestRow.state == RequestState.QUEUED)
    ).one()
    return int(found)


def open_requests_for(session: Session, user: str) -> list[RequestRow]:
    """The user's requests still waiting for a person or for GPUs."""
    stmt = select(RequestRow).where(
        RequestRow.requester == user,
        col(RequestRow.state).in_([RequestState.PENDING, RequestState.QUEUED]),
    )
    return list(session.exec(stmt).all())


def ordered_queue(
    session: Session,
    policy: Policy,
    pool: str,
    *,
    extra: RequestRow | None = None,
    usage: Mapping[str, float] | Callable[[], Mapping[str, float]] | None = None,
    also_held: Mapping[str, int] | None = None,
) -> list[tuple[RequestRow, bool]]:
    """The pool's queued borrows in serving order (rules.queueing.queue_order), each with
    whether it is inside its team's nominal; `extra`, a request not queued (yet), placed
    among them as if it were; `usage`, each team's recent usage for fair share (or what
    reads it, called only when fair share can change the order); `also_held`, GPUs per team
    counted as held besides its leases (a lease that would start now)."""
    rows = list(per_transaction(session, ("queued", pool), lambda: _queued_borrows(session, pool)))
    if extra is not None and all(r.id != extra.id or r.id is None for r in rows):
        rows.append(extra)
    if not rows:
        return []
    quotas = policy.pools[pool].quotas if pool in policy.pools else {}
    last = max((r.id for r in rows if r.id is not None), default=0) + 1  # a new one goes last
    by_id = {r.id if r.id is not None else last: r for r in rows}
    items = [
        Queued(key, r.team, r.gpus, r.priority, r.created_at, timedelta(seconds=r.duration_s))
        for key, r in by_id.items()
    ]
    held = dict(held_now(session, pool))
    for team, gpus in (also_held or {}).items():
        held[team] = held.get(team, 0) + gpus
    order = queue_order(items, held, quotas, usage)
    return [(by_id[q.request], inside) for q, inside in order]


def held_now(session: Session, pool: str) -> Mapping[str, int]:
    """GPUs held per team in the pool (`storage.leases.held_by_team`), read once while the
    transaction changes nothing: a decision asks it of the pool's usage and of its queue."""
    return per_transaction(session, ("held", pool), lambda: held_by_team(session, pool))


def _queued_borrows(session: Session, pool: str) -> list[RequestRow]:
    stmt = select(RequestRow).where(
        RequestRow.pool == pool,
        RequestRow.state == RequestState.QUEUED,
        RequestRow.kind == RequestKind.BORROW,
    )
    return list(session.exec(stmt).all())


def pools_with_queue(session: Session) -> set[str]:
    """The pools where borrows wait in the queue."""
    found = session.exec(
        select(RequestRow.pool)
        .where(RequestRow.state == RequestState.QUEUED, RequestRow.kind == RequestKind.BORROW)
        .distinct()
    ).all()
    return set(found)
