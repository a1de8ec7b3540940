"""Extensions: a holder asks for more time, the rules decide, and an approved extension is
applied (at once, or when a manager approves it through `settling`).

A recalled lease is never extended, and an extension waits behind the queued demand that
outranks its lease (`pool.queued`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from sqlmodel import Session

from bot.services import notices
from bot.services.context import Context, record
from bot.services.grants import decide
from bot.services.leases import to_change
from bot.services.reads import lease_view, request_view
from bot.services.results import ExtendResult, LeaseView, Refused
from rules.approvals import MAX_REASON, approvers_for, reason_too_long, route_for
from rules.domain import LeaseState, Outcome, Priority, RequestKind, RequestState
from rules.facts import request_facts
from storage import leases as storage_leases
from storage import requests
from storage.audit import AuditTag
from storage.pools import pool_usage
from storage.requests import ordered_queue
from storage.tables import LeaseRow, RequestRow


def _check_asked(by: timedelta, reason: str) -> Refused | None:
    """What no rule needs to weigh: a duration that adds nothing, a reason too long to read."""
    if by <= timedelta(0):
        return Refused("Extend by a positive duration, e.g. `+2h`.", "bad-duration")
    if len(reason.strip()) > MAX_REASON:
        return Refused(reason_too_long(reason), "long-reason")
    return None


def extend(
    ctx: Context, user: str, lease_id: int, by: timedelta, reason: str = ""
) -> ExtendResult | Refused:
    """Ask the rules for more time: approve extends at once, ask waits for a manager."""
    refused = _check_asked(by, reason)
    if refused is not None:
        return refused
    policy = ctx.policy
    now = ctx.now()
    with ctx.db.write() as session:
        lease = to_change(ctx, session, user, lease_id)
        if isinstance(lease, Refused):
            return lease
        if lease.team not in policy.teams or lease.pool not in policy.pools:
            return Refused(f"L{lease_id}'s team or pool left the rule files; ask an admin.")
        recalled = recall_refusal(lease)
        if recalled is not None:
            return recalled
        assert lease.id is not None
        waiting = requests.pending_extension(session, lease.id)
        if waiting is not None:
            return Refused(
                f"L{lease_id} already has an extension waiting for approval (R{waiting}). "
                "Wait for that answer, or withdraw it in `/gpu mine` and ask again.",
                "extension-pending",
            )
        facts = extension_facts(ctx, session, lease, by, has_reason=bool(reason.strip()))
        decision = decide(ctx, facts)
        assert decision.verdict is not None
        assert decision.verdict.outcome is not None
        outcome = decision.verdict.outcome
        # An extension cannot wait for GPUs it already holds: "queue" means "not now".
        state = {
            Outcome.APPROVE: RequestState.APPROVED,
            Outcome.ASK: RequestState.PENDING,
        }.get(outcome, RequestState.DENIED)
        who = decision.verdict.approvers or "managers"
        request = RequestRow(
            kind=RequestKind.EXTEND,
            requester=user,
            team=lease.team,
            pool=lease.pool,
            gpus=lease.gpus,
            duration_s=int(by.total_seconds()),
            priority=lease.priority,
            reason=reason.strip(),
            state=state,
            outcome=str(decision.verdict),
            approvers=approvers_for(policy, lease.team, who)
            if state == RequestState.PENDING
            else [],
            approval_route=route_for(policy, lease.team, who)
            if state == RequestState.PENDING
            else "",
            lease_id=lease.id,
            created_at=now,
        )
        if state != RequestState.PENDING:
            request.decided_at, request.decided_by = now, "gpubot"
        session.add(request)
        session.flush()
        tag = {RequestState.APPROVED: "approved", RequestState.PENDING: "asked"}.get(
            state, "denied"
        )
        row = record(
            session,
            at=now,
            actor=user,
            tag=AuditTag(f"extend:{tag}"),
            subject=f"request:{request.id}",
            decision=decision,
            detail={"lease": lease.id, "by_s": request.duration_s},
        )
        request.audit_id = row.id
        session.add(request)
        if state == RequestState.PENDING:
            notices.approval_cards(session, request, at=now)
        view = lease_view(session, lease)
        if state == RequestState.APPROVED:
            view = apply_extension(ctx, session, request, actor="gpubot", now=now)
        if outcome == Outcome.QUEUE:
            outcome = Outcome.DENY
        return ExtendResult(
            outcome, view, decision.because, decision.deciding, request_view(request)
        )


def recall_refusal(lease: LeaseRow) -> Refused | None:
    """A recalled lease is never extended: its GPUs go back to their lending team (or to a
    higher-priority request of its own team)."""
    recalled = lease.warnings.recall
    if recalled is None:
        return None
    why = (
        f"R{recalled.get('request')}, a higher-priority request of your team, needs its GPUs"
        if lease.warnings.recalled_within_team
        else "its GPUs are borrowed, and their lending team needs them back for "
        f"R{recalled.get('request')}"
    )
    return Refused(
        f"L{lease.id} is being recalled: {why}, so it cannot be extended. "
        "`/gpu why` shows why; `/gpu borrow` asks again once it ends.",
        "recalled",
    )


def extension_facts(
    ctx: Context, session: Session, lease: LeaseRow, by: timedelta, *, has_reason: bool
) -> dict[str, object]:
    """The request facts of extending `lease` by `by`, as the pool stands now."""
    return request_facts(
        ctx.policy,
        kind=RequestKind.EXTEND,
        user=lease.holder,
        team=lease.team,
        pool=lease.pool,
        gpus=lease.gpus,
        duration=by,
        priority=Priority(lease.priority),
        has_reason=has_reason or bool(lease.reason),
        # pool.queued: the waiting demand that outranks this lease
        usage=replace(
            pool_usage(session, lease.pool),
            queued=waiting_before(ctx, session, lease.pool, Priority(lease.priority)),
        ),
        lease_extensions=lease.extensions,
        lease_extended=timedelta(seconds=lease.extended_s),
    )


def recheck_extension(ctx: Context, session: Session, request: RequestRow) -> str | None:
    """Before an approved extension is applied: why it can no longer be, or None.

    The lease may have ended, been recalled, or reached its limits since the request."""
    assert request.lease_id is not None
    lease = storage_leases.lock(session, request.lease_id)
    if lease is None or lease.state != LeaseState.ACTIVE:
        return f"L{request.lease_id} has ended."
    recalled = recall_refusal(lease)
    if recalled is not None:
        return recalled.message
    by = timedelta(seconds=request.duration_s)
    facts = extension_facts(ctx, session, lease, by, has_reason=bool(request.reason))
    decision = decide(ctx, facts)
    if decision.verdict is not None and decision.verdict.outcome == Outcome.DENY:
        return decision.because
    return None


def apply_extension(
    ctx: Context, session: Session, request: RequestRow, *, actor: str, now: datetime
) -> LeaseView:
    """Move the expiry, count the extension and clear the expiry warnings it made moot."""
    assert request.lease_id is not None
    lease = storage_leases.lock(session, request.lease_id)
    assert lease is not None
    before = lease.expires_at
    lease.expires_at = max(lease.expires_at, now) + timedelta(seconds=request.duration_s)
    lease.extensions += 1
    lease.extended_s += request.duration_s
    lease.warnings = lease.warnings.without_expiry()
    session.add(lease)
    session.flush()
    record(
        session,
        at=now,
        actor=actor,
        tag=AuditTag.LEASE_EXTENDED,
        subject=f"lease:{lease.id}",
        outcome="active",
        detail={
            "request": request.id,
            "from": before.isoformat(),
            "to": lease.expires_at.isoformat(),
            "extensions": lease.extensions,
        },
    )
    notices.lease_changed(session, lease.id, lease.holder, at=now)
    return lease_view(session, lease)


def waiting_before(ctx: Context, session: Session, pool: str, priority: Priority) -> int:
    """Queued requests in the pool that outrank a lease of `priority` wanting more time:
    those inside their team's nominal, and those of the same or a higher priority."""
    return sum(
        1
        for r, inside in ordered_queue(session, ctx.policy, pool)
        if inside or Priority(r.priority).rank >= priority.rank
    )
