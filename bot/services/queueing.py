"""The queue: requests waiting for GPUs are granted when GPUs come free: those inside their
team's nominal quota first, then the highest priority, then in order of arrival; the head of a
pool's queue is never overtaken."""

from __future__ import annotations

from sqlmodel import Session

from bot.services import admin, notices
from bot.services.context import SYSTEM, Context, record
from bot.services.grants import decide, facts_now, grant
from bot.services.results import LeaseView
from rules.approvals import approvers_for, route_for
from rules.domain import (
    Outcome,
    RequestState,
    format_duration,
)
from storage.audit import AuditTag
from storage.outbox import owe
from storage.pools import lock as lock_pool
from storage.requests import ordered_queue, queued_since
from storage.tables import RequestRow


def serve_queue(ctx: Context, pools: list[str] | None = None) -> list[LeaseView]:
    """Grant what now fits, pool by pool; stop at a head that still has to wait.

    Requests that waited longer than the pool's `max_queue_wait` are withdrawn first, and
    their requesters told."""
    granted: list[LeaseView] = []
    for pool in pools if pools is not None else sorted(ctx.policy.pools):
        _time_out(ctx, pool)
        while True:
            with ctx.db.write() as session:
                lock_pool(session, pool)
                head = _head(ctx, session, pool)
                if head is None:
                    break
                lease, moved = _serve(ctx, session, head)
            if lease is not None:
                granted.append(lease)
            if not moved:
                break
    return granted


def _time_out(ctx: Context, pool: str) -> None:
    """Withdraw what waited too long; while automation is paused, only record that it would
    have (the request keeps its place and is withdrawn at the first pass after resume)."""
    limit = ctx.policy.pools[pool].limits.max_queue_wait
    now = ctx.now()
    with ctx.db.write() as session:
        stale = queued_since(session, pool, now - limit)
        paused = bool(stale) and admin.is_paused(session, ctx)
        for request in stale:
            why = f"it waited longer than {format_duration(limit)} for free GPUs"
            if paused:
                text = f"R{request.id} would have been withdrawn from the {pool} queue: {why}."
                tag, subject = AuditTag.QUEUE_WOULD_HAVE, f"request:{request.id}"
                admin.would_have(
                    session,
                    ctx,
                    tag=tag,
                    subject=subject,
                    outcome="would cancel",
                    text=text,
                    at=now,
                )
                continue
            request.state, request.decided_at = RequestState.CANCELLED, now
            request.decided_by = SYSTEM
            session.add(request)
            record(
                session,
                at=now,
                actor=SYSTEM,
                tag=AuditTag.QUEUE_TIMED_OUT,
                subject=f"request:{request.id}",
                outcome="cancelled",
                detail={"why": why},
            )
            notices.settled(session, request, by=SYSTEM, verdict="timeout", reason=why, at=now)


def _head(ctx: Context, session: Session, pool: str) -> RequestRow | None:
    ordered = ordered_queue(session, ctx.policy, pool)
    return ordered[0][0] if ordered else None


def _serve(ctx: Context, session: Session, request: RequestRow) -> tuple[LeaseView | None, bool]:
    """Settle the head if the rules allow it now; (lease granted, whether the queue moved)."""
    now = ctx.now()
    decision = decide(ctx, facts_now(ctx, session, request))
    assert decision.verdict is not None
    outcome = decision.verdict.outcome
    person = request.decided_by not in (None, SYSTEM)  # a manager already said yes
    subject = f"request:{request.id}"
    if outcome == Outcome.DENY:
        request.state, request.decided_at, request.decided_by = RequestState.DENIED, now, SYSTEM
        session.add(request)
        record(
            session,
            at=now,
            actor=SYSTEM,
            tag=AuditTag.BORROW_DENIED,
            subject=subject,
            decision=decision,
            detail={"from": "queue"},
        )
        notices.settled(
            session, request, by=SYSTEM, verdict="deny", reason=decision.because, at=now
        )
        return None, True
    if outcome == Outcome.ASK and not person:
        who = decision.verdict.approvers or "managers"
        request.state = RequestState.PENDING
        request.approvers = approvers_for(ctx.policy, request.team, who)
        request.approval_route = route_for(ctx.policy, request.team, who)
        session.add(request)
        record(
            session,
            at=now,
            actor=SYSTEM,
            tag=AuditTag.BORROW_ASKED,
            subject=subject,
            decision=decision,
            detail={"from": "queue"},
        )
        notices.approval_cards(session, request, at=now)
        return None, True
    if outcome == Outcome.QUEUE or (person and decision.once_approved() == Outcome.QUEUE):
        return None, False  # still waiting, and nobody behind it goes first
    lease = grant(ctx, session, request, now, actor=SYSTEM, decision=decision)
    if lease is None:
        return None, False
    request.state, request.decided_at = RequestState.APPROVED, now
    request.decided_by = request.decided_by or SYSTEM
    session.add(request)
    if request.approval_route:  # approved, then queued: its cards now say granted
        owe(session, notices.card_redrawn(request, by=SYSTEM), at=now)
    record(
        session,
        at=now,
        actor=SYSTEM,
        tag=AuditTag.QUEUE_GRANTED,
        subject=subject,
        decision=decision,
        outcome="approve",
        detail={"lease": lease.id},
    )
    return lease, True
