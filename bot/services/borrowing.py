"""Borrowing: a person asks, the rules decide, and a manager settles what the rules left open.

Each use case is one database transaction; its audit rows are written in that transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from bot.services import notices
from bot.services.context import Context, record
from bot.services.reads import lease_view, request_view
from bot.services.views import BorrowResult, LeaseView, Refused, RequestView, SettleResult
from rules import approvals
from rules.approvals import approvers_for, route_for
from rules.domain import LeaseState, Outcome, Priority, RequestKind, RequestState, Subject
from rules.engine import Decision
from rules.facts import request_facts
from rules.placement import place
from rules.policy import Policy
from storage import leases, requests
from storage.gpus import FreeGpus, Place, claimable, free_for, gpu_ids, gpu_lines
from storage.pools import lock as lock_pool
from storage.pools import pool_usage
from storage.requests import ordered_queue
from storage.tables import ApprovalRow, LeaseGpuRow, LeaseRow, RequestRow

SYSTEM = "gpubot"  # the actor of what the bot does on its own


@dataclass(frozen=True)
class BorrowAsk:
    """What a person asked for; a missing duration takes the pool's default."""

    pool: str
    gpus: int
    duration: timedelta | None = None
    priority: Priority = Priority.NORMAL
    reason: str = ""
    # GPUs to take when they are free (reserving a GPU one's process already runs on).
    prefer: tuple[tuple[str, int], ...] = ()


def check_ask(policy: Policy, user: str, ask: BorrowAsk) -> Refused | None:
    """What no rule needs to weigh (`rules.approvals.check_ask`), as the use case's answer."""
    refusal = approvals.check_ask(policy, user, pool=ask.pool, gpus=ask.gpus, duration=ask.duration)
    return None if refusal is None else Refused(refusal.message, refusal.code)


def borrow(ctx: Context, user: str, ask: BorrowAsk) -> BorrowResult | Refused:
    """Decide a borrow: approve places GPUs at once, ask waits for a manager, queue waits for
    GPUs, deny says why. Everything, the audit rows too, commits together or not at all."""
    policy = ctx.policy
    refused = check_ask(policy, user, ask)
    if refused is not None:
        return refused
    team = policy.team_of(user)
    assert team is not None
    duration = ask.duration or policy.pools[ask.pool].limits.default_duration
    now = ctx.now()
    with ctx.db.write() as session:
        lock_pool(session, ask.pool)
        if ask.prefer and not claimable(session, policy, user, ask.pool, ask.prefer):
            return _not_claimable(session, user, ask)
        free = free_for(session, policy, user, ask.pool)
        usage = pool_usage(session, ask.pool, free)
        # pool.queued: the waiting requests that would be served before this one
        usage = replace(usage, queued=_ahead(ctx, session, ask, team.name, now))
        facts = request_facts(
            policy,
            kind=RequestKind.BORROW,
            user=user,
            team=team.name,
            pool=ask.pool,
            gpus=ask.gpus,
            duration=duration,
            priority=ask.priority,
            has_reason=bool(ask.reason.strip()),
            usage=usage,
        )
        decision = ctx.live.decide(Subject.REQUEST, facts)
        assert decision.verdict is not None
        assert decision.verdict.outcome is not None
        outcome = decision.verdict.outcome
        approvers = decision.verdict.approvers or "managers"
        request = RequestRow(
            kind=RequestKind.BORROW,
            requester=user,
            team=team.name,
            pool=ask.pool,
            gpus=ask.gpus,
            duration_s=int(duration.total_seconds()),
            priority=ask.priority,
            reason=ask.reason.strip(),
            state=_STATE_OF[outcome],
            outcome=str(decision.verdict),
            approvers=approvers_for(policy, team.name, approvers) if outcome == Outcome.ASK else [],
            approval_route=route_for(policy, team.name, approvers)
            if outcome == Outcome.ASK
            else "",
            created_at=now,
        )
        if outcome in (Outcome.APPROVE, Outcome.DENY):
            request.decided_at, request.decided_by = now, SYSTEM
        session.add(request)
        session.flush()
        row = record(
            session,
            at=now,
            actor=user,
            tag=f"borrow:{_TAG_OF[outcome]}",
            subject=f"request:{request.id}",
            decision=decision,
            detail={"gpus": ask.gpus, "pool": ask.pool, "duration_s": request.duration_s},
        )
        request.audit_id = row.id
        if outcome == Outcome.ASK:
            notices.approval_cards(session, request, at=now)
        lease = None
        if outcome == Outcome.APPROVE:
            lease = _grant(
                ctx,
                session,
                request,
                now,
                actor=SYSTEM,
                decision=decision,
                free=free,
                prefer=ask.prefer,
            )
            if lease is None:  # the rules saw free GPUs, placement found none: wait for them
                request.state, request.outcome = RequestState.QUEUED, Outcome.QUEUE.value
                outcome = Outcome.QUEUE
        session.add(request)
        session.flush()
        view = request_view(request)
    return BorrowResult(outcome, view, decision.because, decision.deciding, lease)


_STATE_OF = {
    Outcome.APPROVE: RequestState.APPROVED,
    Outcome.ASK: RequestState.PENDING,
    Outcome.QUEUE: RequestState.QUEUED,
    Outcome.DENY: RequestState.DENIED,
}
_TAG_OF = {
    Outcome.APPROVE: "approved",
    Outcome.ASK: "asked",
    Outcome.QUEUE: "queued",
    Outcome.DENY: "denied",
}


def _not_claimable(session: Session, user: str, ask: BorrowAsk) -> Refused:
    """A one-click borrow of particular GPUs that can no longer be had: say why, take nothing
    else in their place (the button named those GPUs)."""
    lines = {(g.node, g.index): g for g in gpu_lines(session, ask.pool)}
    ids = [g.lease_id for g in lines.values() if g.lease_id is not None]
    holders = leases.holders(session, ids)
    for node, index in ask.prefer:
        line = lines.get((node, index))
        where = f"{node} GPU {index}"
        if line is None:
            why = f"{where} is not in pool {ask.pool}"
        elif line.lease_id is not None and holders.get(line.lease_id) == user:
            why = f"{where} is yours already, in L{line.lease_id}"
        elif line.lease_id is not None:
            why = f"{where} is leased to someone else now (L{line.lease_id})"
        elif line.place == Place.OCCUPIED:
            why = f"someone else's work runs on {where} now"
        elif line.place != Place.FREE:
            why = f"{where} is out of service"
        else:
            continue
        return Refused(
            f"Nothing was borrowed: {why}. `/gpu borrow {ask.gpus} {ask.pool}` asks for any "
            "free GPUs instead.",
            "not-claimable",
        )
    return Refused("Nothing was borrowed: those GPUs cannot be had now.", "not-claimable")


def _grant(
    ctx: Context,
    session: Session,
    request: RequestRow,
    now: datetime,
    *,
    actor: str,
    decision: Decision | None,
    free: FreeGpus | None = None,
    prefer: tuple[tuple[str, int], ...] = (),
) -> LeaseView | None:
    """Place the request's GPUs best-fit and create the active lease; None if they don't fit.

    Preferred GPUs are taken as they are when all of them are free and they are as many as
    asked for."""
    if free is None:
        free = free_for(session, ctx.policy, request.requester, request.pool)
    slots: list[tuple[str, int]] | None = None
    own = len(prefer) == request.gpus and claimable(
        session, ctx.policy, request.requester, request.pool, prefer
    )
    if prefer and own:
        slots = list(prefer)
    if slots is None:
        slots = place(free, request.gpus, free.unknown)
    if slots is None:
        return None
    unsure = sorted(set(slots) & free.unknown)
    pool = ctx.policy.pools[request.pool]
    lease = LeaseRow(
        holder=request.requester,
        team=request.team,
        pool=request.pool,
        gpus=request.gpus,
        priority=request.priority,
        protected=pool.protected,
        reason=request.reason,
        state=LeaseState.ACTIVE,
        granted_at=now,
        expires_at=now + timedelta(seconds=request.duration_s),
    )
    session.add(lease)
    session.flush()
    assert lease.id is not None
    for gpu_id in gpu_ids(session, slots):
        session.add(LeaseGpuRow(lease_id=lease.id, gpu_id=gpu_id, active=True))
    session.flush()  # the partial unique index refuses a GPU already in an active lease here
    request.lease_id = lease.id
    unknown = tuple(f"{n}:{i}" for n, i in unsure)
    notices.granted(session, lease, at=now, unknown=unknown)
    notices.waiting_cards(session, request.pool, at=now, besides=request.id)
    view = replace(lease_view(session, lease), unknown=unknown)
    record(
        session,
        at=now,
        actor=actor,
        tag="lease:granted",
        subject=f"lease:{lease.id}",
        outcome="active",
        detail={
            "request": request.id,
            "holder": lease.holder,
            "gpus": [f"{s.node}:{s.index}" for s in view.gpus],
            "expires_at": lease.expires_at.isoformat(),
            "revision": decision.revision if decision else ctx.policy.revision,
        },
    )
    return view


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
            refusal = _may_settle(user, request)
            if refusal is None and request.state != RequestState.PENDING:
                # A click on a card that still offers buttons: make sure it is redrawn.
                notices.redraw(session, notices.card_redrawn(request, by=user), at=now)
                return _already(session, request)
            if refusal is not None:
                record(
                    session,
                    at=now,
                    actor=user,
                    tag="approval:refused",
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
            request = session.get(RequestRow, request_id)
            assert request is not None
            return _already(session, request)


def may_settle(ctx: Context, user: str, request_id: int) -> Refused | None:
    """Why `user` cannot settle this request now (None: they can); records nothing."""
    with ctx.db.read() as session:
        request = session.get(RequestRow, request_id)
        if request is None:
            return Refused(f"There is no request R{request_id}.", "no-request")
        why = _may_settle(user, request)
        if why:
            return Refused(why, "not-allowed")
        if request.state != RequestState.PENDING:
            return Refused(f"R{request_id} is already {request.state}.", "settled")
        return None


def _may_settle(user: str, request: RequestRow) -> str | None:
    return approvals.may_settle(
        user, request_id=request.id, requester=request.requester, approvers=request.approvers
    )


def _already(session: Session, request: RequestRow) -> SettleResult:
    lease = None
    if request.lease_id is not None:
        row = session.get(LeaseRow, request.lease_id)
        lease = lease_view(session, row) if row else None
    by = f" by <@{request.decided_by}>" if request.decided_by not in (None, SYSTEM) else ""
    when = f" at {request.decided_at:%Y-%m-%d %H:%M} UTC" if request.decided_at else ""
    message = f"R{request.id} was already settled{by}{when}: it is {request.state}."
    return SettleResult(request_view(request), lease, message, already_settled=True)


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
        tag=f"{request.kind}:denied",
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
        from bot.services.leases import apply_extension, recheck_extension  # noqa: PLC0415

        refused = recheck_extension(ctx, session, request)
        if refused is not None:  # ended, recalled, or at its limits since it was asked
            detail = {"by": user, "why": refused}
            return _no_longer(
                session, request, user, now, refused, detail=detail, tag="extend:denied"
            )
        lease = apply_extension(ctx, session, request, actor=user, now=now)
        request.state = RequestState.APPROVED
        session.add(request)
        notices.settled(session, request, by=user, verdict="approve", reason=reason, at=now)
        return SettleResult(request_view(request), lease, f"<@{user}> approved R{request.id}.")
    lock_pool(session, request.pool)
    decision = ctx.live.decide(Subject.REQUEST, _facts_again(ctx, session, request))
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
        tag="borrow:approved",
        subject=f"request:{request.id}",
        decision=decision,
        outcome="approve",
        detail=detail,
    )
    # The approval answers `ask`; a `queue` that matched too (lenders have too little) holds.
    waits = decision.once_approved() == Outcome.QUEUE
    granted = None if waits else _grant(ctx, session, request, now, actor=user, decision=decision)
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


def _ahead(ctx: Context, session: Session, ask: BorrowAsk, team: str, now: datetime) -> int:
    new = RequestRow(
        kind=RequestKind.BORROW,
        requester="",
        team=team,
        pool=ask.pool,
        gpus=ask.gpus,
        duration_s=0,
        priority=ask.priority,
        state=RequestState.QUEUED,
        outcome=Outcome.QUEUE.value,
        created_at=now,
    )
    ordered = [r for r, _ in ordered_queue(session, ctx.policy, ask.pool, extra=new)]
    return next(i for i, r in enumerate(ordered) if r is new)


def waiting_before(ctx: Context, session: Session, pool: str, priority: Priority) -> int:
    """Queued requests in the pool that outrank a lease of `priority` wanting more time:
    those inside their team's nominal, and those of the same or a higher priority."""
    return sum(
        1
        for r, inside in ordered_queue(session, ctx.policy, pool)
        if inside or Priority(r.priority).rank >= priority.rank
    )


def _no_longer(
    session: Session,
    request: RequestRow,
    user: str,
    now: datetime,
    why: str,
    *,
    detail: dict[str, str],
    tag: str = "borrow:denied",
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


def _facts_again(
    ctx: Context, session: Session, request: RequestRow, *, ahead: int = 0
) -> dict[str, object]:
    """The request's facts now. `pool.queued` is what waits ahead of it: none for the head
    of the queue, and none for a request a person approves (the card said whom it overtakes)."""
    free = free_for(session, ctx.policy, request.requester, request.pool)
    usage = pool_usage(session, request.pool, free)
    return request_facts(
        ctx.policy,
        kind=RequestKind.BORROW,
        user=request.requester,
        team=request.team,
        pool=request.pool,
        gpus=request.gpus,
        duration=timedelta(seconds=request.duration_s),
        priority=Priority(request.priority),
        has_reason=bool(request.reason),
        usage=replace(usage, queued=ahead),
    )


def cancel(ctx: Context, user: str, request_id: int) -> RequestView | Refused:
    """The requester (or an admin) withdraws a request still waiting for a person or GPUs."""
    now = ctx.now()
    with ctx.db.write() as session:
        request = requests.lock(session, request_id)
        if request is None:
            return Refused(f"There is no request R{request_id}.", "no-request")
        if user != request.requester and not ctx.policy.is_admin(user):
            return Refused(f"R{request_id} is <@{request.requester}>'s to cancel.", "not-yours")
        if not RequestState(request.state).is_open:
            return Refused(f"R{request_id} is already {request.state}.", "settled")
        request.state, request.decided_at, request.decided_by = RequestState.CANCELLED, now, user
        session.add(request)
        if request.approval_route:  # its cards (buttons, or "approved, waiting") say withdrawn
            notices.settled(
                session, request, by=user, verdict="cancel", reason="", at=now, tell_requester=False
            )
        record(
            session,
            at=now,
            actor=user,
            tag="request:cancelled",
            subject=f"request:{request.id}",
            outcome="cancelled",
        )
        return request_view(request)
