"""Settling: a manager's (or admin's) Approve or Deny of a request the rules left open.

Exactly one approval settles a request (a unique constraint); a repeated click answers with
what already happened. Who may settle is asked first (`rules.approvals.may_settle`), and an
approval asks the rules again, so a deny or a full pool since the request still holds.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from bot.services import notices
from bot.services.context import SYSTEM, Context, record
from bot.services.extensions import apply_extension, recheck_extension
from bot.services.grants import decide, facts_now, grant
from bot.services.reads import lease_view, request_view
from bot.services.results import LeaseView, Refused, SettleResult, reader_time
from rules import approvals
from rules.decision import Decision
from rules.domain import LeaseState, Outcome, RequestKind, RequestState
from storage import leases, requests
from storage.audit import AuditTag
from storage.pools import lock as lock_pool
from storage.tables import ApprovalRow, RequestRow


def settle(
    ctx: Context, user: str, request_id: int, *, approve: bool, reason: str = ""
) -> SettleResult | Refused:
    """A manager's (or admin's) Approve or Deny. Exactly one settles a request; repeated
    clicks answer with what already happened and change nothing."""
    now = ctx.now()
    verdict = "approve" if approve else "deny"
    try:
        with ctx.db.write() as session:
            request = requests.lock(session, request_id)
            if request is None:
                return Refused(f"There is no request R{request_id}.", "no-request")
            # Who may settle it is asked first: a refusal says nothing of the request's fate.
            refusal = _may_settle(ctx, user, request)
            if refusal is None and request.state != RequestState.PENDING:
                # A click on a card that still offers buttons: make sure it is redrawn.
                notices.redraw(session, notices.card_redrawn(request, by=user), at=now)
                return _already(session, request)
            if refusal is not None:
                record(
                    session,
                    at=now,
                    actor=user,
                    tag=AuditTag.APPROVAL_REFUSED,
                    subject=f"request:{request.id}",
                    outcome="refused",
                    detail={"verdict": verdict, "why": refusal},
                )
                return Refused(refusal, "not-allowed")
            session.add(
                ApprovalRow(
                    request_id=request_id, approver=user, verdict=verdict, reason=reason, at=now
                )
            )
            session.flush()  # one approval per request: a concurrent second one fails here
            request.decided_at, request.decided_by = now, user
            if not approve:
                return _deny(session, request, user, reason, now=now)
            return _approve(ctx, session, request, user, reason, now=now)
    except IntegrityError:
        with ctx.db.read() as session:
            request = requests.get(session, request_id)
            assert request is not None
            return _already(session, request)


def may_settle(ctx: Context, user: str, request_id: int) -> Refused | None:
    """Why `user` cannot settle this request now (None: they can); records nothing."""
    with ctx.db.read() as session:
        request = requests.get(session, request_id)
        if request is None:
            return Refused(f"There is no request R{request_id}.", "no-request")
        why = _may_settle(ctx, user, request)
        if why:
            return Refused(why, "not-allowed")
        if request.state != RequestState.PENDING:
            return Refused(f"R{request_id} is already {request.state}.", "settled")
        return None


def _may_settle(ctx: Context, user: str, request: RequestRow) -> str | None:
    return approvals.may_settle(
        user,
        request_id=request.id,
        requester=request.requester,
        approvers=request.approvers,
        team=ctx.policy.teams.get(request.team),
        admins=ctx.policy.admins,
    )


def _already(session: Session, request: RequestRow) -> SettleResult:
    lease = None
    if request.lease_id is not None:
        row = leases.get(session, request.lease_id)
        lease = lease_view(session, row) if row else None
    by = f" by <@{request.decided_by}>" if request.decided_by not in (None, SYSTEM) else ""
    when = f" {reader_time(request.decided_at)}" if request.decided_at else ""
    message = f"R{request.id} was already settled{by}{when}: it is {request.state}."
    if lease is not None and _ended_before_approval(request, lease):
        message = (
            f"R{request.id} can no longer be approved: {lease.code} ended before anyone "
            f"answered, so there is nothing left to extend. <@{request.requester}> was told, "
            "and can borrow again."
        )
    return SettleResult(request_view(request), lease, message, already_settled=True)


def _ended_before_approval(request: RequestRow, lease: LeaseView) -> bool:
    """An extension withdrawn because its lease ended while it waited for a person."""
    return (
        request.kind == RequestKind.EXTEND
        and request.state == RequestState.CANCELLED
        and lease.state != LeaseState.ACTIVE
    )


def _deny(
    session: Session, request: RequestRow, user: str, reason: str, *, now: datetime
) -> SettleResult:
    request.state = RequestState.DENIED
    session.add(request)
    notices.settled(session, request, by=user, verdict="deny", reason=reason, at=now)
    record(
        session,
        at=now,
        actor=user,
        tag=AuditTag(f"{request.kind}:denied"),
        subject=f"request:{request.id}",
        outcome="deny",
        detail={"reason": reason, "by": user},
    )
    message = f"<@{user}> denied R{request.id}" + (f": {reason}" if reason else ".")
    return SettleResult(request_view(request), None, message)


def _approve(
    ctx: Context, session: Session, request: RequestRow, user: str, reason: str, *, now: datetime
) -> SettleResult:
    """An approval answers `ask`; the rules are asked again so a deny or a full pool still
    holds (quotas may have moved since the request was made)."""
    if request.kind == RequestKind.EXTEND:
        refused = recheck_extension(ctx, session, request)
        if refused is not None:  # ended, recalled, or at its limits since it was asked
            detail = {"by": user, "why": refused}
            return _no_longer(
                session, request, user, now, refused, detail=detail, tag=AuditTag.EXTEND_DENIED
            )
        lease = apply_extension(ctx, session, request, actor=user, now=now)
        request.state = RequestState.APPROVED
        session.add(request)
        notices.settled(session, request, by=user, verdict="approve", reason=reason, at=now)
        return SettleResult(request_view(request), lease, f"<@{user}> approved R{request.id}.")
    lock_pool(session, request.pool)
    decision = decide(ctx, facts_now(ctx, session, request))
    assert decision.verdict is not None
    outcome = decision.verdict.outcome
    detail = {"reason": reason, "by": user, "rules_now": str(decision.verdict)}
    if outcome == Outcome.DENY:
        why = decision.because
        return _no_longer(session, request, user, now, why, detail=detail, decision=decision)
    record(
        session,
        at=now,
        actor=user,
        tag=AuditTag.BORROW_APPROVED,
        subject=f"request:{request.id}",
        decision=decision,
        outcome="approve",
        detail=detail,
    )
    # The approval answers `ask`; a `queue` that matched too (lenders have too little) holds.
    waits = decision.once_approved() == Outcome.QUEUE
    granted = None if waits else grant(ctx, session, request, now, actor=user, decision=decision)
    if granted is None:
        request.state = RequestState.QUEUED
        why = _queue_reason(decision) if waits else "free GPUs"
        message = f"<@{user}> approved R{request.id}; it waits for {why}."
    else:
        request.state = RequestState.APPROVED
        message = f"<@{user}> approved R{request.id}."
    session.add(request)
    # A grant's own DM tells the requester; only a wait needs its own word.
    notices.settled(
        session,
        request,
        by=user,
        verdict="approve",
        reason=reason,
        at=now,
        tell_requester=granted is None,
    )
    return SettleResult(request_view(request), granted, message)


def _no_longer(
    session: Session,
    request: RequestRow,
    user: str,
    now: datetime,
    why: str,
    *,
    detail: dict[str, str],
    tag: AuditTag = AuditTag.BORROW_DENIED,
    decision: Decision | None = None,
) -> SettleResult:
    """An approval that comes too late: the request is denied, with why, and its cards say so."""
    request.state = RequestState.DENIED
    session.add(request)
    record(
        session,
        at=now,
        actor=user,
        tag=tag,
        subject=f"request:{request.id}",
        decision=decision,
        outcome="deny",
        detail=detail,
    )
    message = f"R{request.id} can no longer be granted: {why}"
    notices.settled(session, request, by=user, verdict="deny", reason=message, at=now)
    return SettleResult(request_view(request), None, message)


def _queue_reason(decision: Decision) -> str:
    """Why an approved request still waits, from the `queue` rule that holds it."""
    found = (m.because for m in decision.matches if m.verdict.outcome == Outcome.QUEUE)
    return f"its turn: {next(found, 'no GPUs are free')}"
