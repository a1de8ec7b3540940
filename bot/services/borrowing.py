"""Borrowing: a person asks, the rules decide, and a manager settles what the rules left open.

Each use case is one database transaction; its audit rows are written in that transaction.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlmodel import Session

from bot.services import notices
from bot.services.context import SYSTEM, Context, record
from bot.services.grants import decide, grant, guarantees_in, owed_to, queue_of
from bot.services.queueing import pushed_back, queued, timeline
from bot.services.reads import request_view
from bot.services.results import BorrowResult, Refused, RequestView
from rules import approvals
from rules.approvals import approvers_for, route_for
from rules.domain import Outcome, Priority, RequestKind, RequestState
from rules.facts import request_facts
from rules.policy import Backfill, Policy
from rules.queueing import expected_starts
from storage import leases, requests
from storage.audit import AuditTag
from storage.gpus import Place, claimable, free_for, gpu_lines
from storage.pools import lock as lock_pool
from storage.pools import pool_usage
from storage.tables import RequestRow


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
    refusal = approvals.check_ask(
        policy, user, pool=ask.pool, gpus=ask.gpus, duration=ask.duration, reason=ask.reason
    )
    return None if refusal is None else Refused(refusal.message, refusal.code)


def borrow(
    ctx: Context, user: str, ask: BorrowAsk, *, within: Session | None = None
) -> BorrowResult | Refused:
    """Decide a borrow: approve places GPUs at once, ask waits for a manager, queue waits for
    GPUs, deny says why. Everything, the audit rows too, commits together or not at all
    (`within`: in the caller's transaction, which then owns the commit)."""
    policy = ctx.policy
    refused = check_ask(policy, user, ask)
    if refused is not None:
        return refused
    team = policy.team_of(user)
    assert team is not None
    duration = ask.duration or policy.pools[ask.pool].limits.default_duration
    now = ctx.now()
    with nullcontext(within) if within is not None else ctx.db.write() as session:
        lock_pool(session, ask.pool)
        if ask.prefer and not claimable(session, policy, user, ask.pool, ask.prefer):
            return _not_claimable(session, user, ask)
        # without GPUs named, only the nodes placement takes them from are read GPU by GPU
        placing = None if ask.prefer else ask.gpus
        free = free_for(session, policy, user, ask.pool, placing=placing)
        usage = pool_usage(session, ask.pool, free)
        # pool.queued: the waiting requests served before this one; what the lenders'
        # waiting guarantees count on is not lendable (one read of the queue for both)
        ahead, owed = _queue_now(ctx, session, ask, team.name, now)
        usage = replace(usage, queued=ahead, owed=owed)
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
        decision = decide(ctx, facts)
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
            tag=AuditTag(f"borrow:{_TAG_OF[outcome]}"),
            subject=f"request:{request.id}",
            decision=decision,
            detail={"gpus": ask.gpus, "pool": ask.pool, "duration_s": request.duration_s},
        )
        request.audit_id = row.id
        if outcome == Outcome.ASK:
            notices.approval_cards(session, request, at=now)
        lease = None
        if outcome == Outcome.APPROVE:
            lease = grant(
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


def _queue_now(
    ctx: Context, session: Session, ask: BorrowAsk, team: str, now: datetime
) -> tuple[int, dict[str, int]]:
    """How many waiting requests the new one would delay by starting now (with `none`
    backfill: how many stand before it), and what the other teams' waiting guarantees in its
    pool count on."""
    duration = ask.duration or ctx.policy.pools[ask.pool].limits.default_duration
    new = RequestRow(
        kind=RequestKind.BORROW,
        requester="",
        team=team,
        pool=ask.pool,
        gpus=ask.gpus,
        duration_s=int(duration.total_seconds()),
        priority=ask.priority,
        state=RequestState.QUEUED,
        outcome=Outcome.QUEUE.value,
        created_at=now,
    )
    queue = queue_of(ctx, session, ask.pool, extra=new)
    place = next(i for i, (r, _) in enumerate(queue) if r is new)
    owed = owed_to(guarantees_in(queue, team))  # the new request is of `team`
    backfill = ctx.policy.queue.backfill
    if place == 0:
        return 0, owed  # nobody stands before it, so nobody can be delayed by it
    if backfill != Backfill.RESERVE:
        return (place if backfill == Backfill.NONE else 0), owed
    line = timeline(ctx, session, ask.pool, now)
    expected_starts([queued(r) for r, _ in queue[:place]], line, backfill)
    if line.deep:
        return place, owed  # too far back for backfill: it waits its turn
    return len(set(line.delays(ask.gpus, duration)) | set(pushed_back(ctx, session, new))), owed


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
            tag=AuditTag.REQUEST_CANCELLED,
            subject=f"request:{request.id}",
            outcome="cancelled",
        )
        return request_view(request)
