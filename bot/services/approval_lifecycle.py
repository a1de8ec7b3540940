"""Requests waiting for a person never stall silently: each sweep reminds the approvers,
escalates, or lets the request expire when `rules.approval_clock` says a step is due; the
requester may nudge the approvers themselves; a pending extension's holder hears before the
lease ends. Every step is stored on the request and audited in one transaction, so a sweep run
twice, or after a restart, never takes a step twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import Session

from bot.services import admin, borrowing, notices
from bot.services.context import SYSTEM, Context, record
from bot.services.reads import request_view
from bot.services.results import BorrowResult, Refused, RequestView
from rules.approval_clock import StepKind, Waiting, next_step, tell_at
from rules.approvals import escalation_settlers, escalation_targets
from rules.domain import Priority, RequestKind, RequestState, format_duration
from rules.policy import Approvals, Policy
from storage import audit, leases, outbox, requests
from storage.audit import AuditTag
from storage.outbox import OutboxKind, Owed, owe
from storage.tables import LeaseRow, RequestRow

#: How often a requester may remind the approvers of one request themselves.
NUDGE_EVERY = timedelta(minutes=15)
REQUESTER = "requester"  # data["to"] of the reminder that tells an extension's holder


@dataclass
class ChaseReport:
    """Request codes for each step this pass took."""

    reminded: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    would_expire: list[str] = field(default_factory=list)
    told: list[str] = field(default_factory=list)

    def steps(self) -> list[str]:
        """Each step taken, as "R4 remind"."""
        taken = {
            "remind": self.reminded,
            "escalate": self.escalated,
            "expire": self.expired,
            "would expire": self.would_expire,
            "tell": self.told,
        }
        return [f"{code} {step}" for step, codes in taken.items() for code in codes]


@dataclass(frozen=True)
class Nudged:
    """The requester reminded the approvers (`at`); they may again from `again_at`."""

    request: RequestView
    approvers: tuple[str, ...]
    at: datetime
    again_at: datetime


@dataclass(frozen=True)
class AskedAgain:
    """*Ask again* clicked once more: the request the first click filed, and who it waits for
    (empty: it no longer waits for anyone)."""

    request: RequestView
    asked: tuple[str, ...]


@dataclass(frozen=True)
class TooSoon:
    """A nudge within NUDGE_EVERY of the last one: nothing was sent."""

    request: RequestView
    ago: timedelta  # since the last nudge
    again_at: datetime


def chase(ctx: Context) -> ChaseReport:
    """One pass over every request waiting for a person (the sweep calls it)."""
    report = ChaseReport()
    now = ctx.now()
    with ctx.db.read() as session:
        # Only a request with a step due is locked: most passes write nothing.
        waiting = [
            r.id for r in requests.pending(session) if r.id and _anything_due(ctx, session, r, now)
        ]
    for request_id in sorted(waiting):
        with ctx.db.write() as session:
            row = requests.lock(session, request_id)
            if row is None or row.state != RequestState.PENDING:
                continue
            _chase_one(ctx, session, row, now, report)
    return report


def _anything_due(ctx: Context, session: Session, row: RequestRow, now: datetime) -> bool:
    if _to_tell(ctx, session, row, now) is not None:
        return True
    waiting = Waiting(row.created_at, row.reminders, row.reminded_at, row.escalated_at is not None)
    settings = ctx.policy.approvals_for(row.team)
    return next_step(waiting, now, settings, deadline=_too_late(ctx, session, row)).due(now)


def _chase_one(
    ctx: Context, session: Session, row: RequestRow, now: datetime, report: ChaseReport
) -> None:
    settings = ctx.policy.approvals_for(row.team)
    if _tell_if_lease_ends_soon(ctx, session, row, now):
        report.told.append(f"R{row.id}")
    waiting = Waiting(row.created_at, row.reminders, row.reminded_at, row.escalated_at is not None)
    step = next_step(waiting, now, settings, deadline=_too_late(ctx, session, row))
    if not step.due(now):
        return
    code = f"R{row.id}"
    if step.kind == StepKind.REMIND:
        remind(ctx, session, row, now=now, actor=SYSTEM)
        report.reminded.append(code)
    elif step.kind == StepKind.ESCALATE:
        escalate(ctx, session, row, settings, now=now)
        report.escalated.append(code)
    elif step.kind == StepKind.EXPIRE:
        if expire(ctx, session, row, settings, now=now):
            report.expired.append(code)
        else:
            report.would_expire.append(code)


def asked(policy: Policy, row: RequestRow) -> list[str]:
    """The people a reminder is for: those the request was routed to first (its team's
    managers, or the admins when the admins were asked), and once it was escalated, the
    people it was escalated to as well."""
    first = [a for a in row.approvers if a not in policy.admins] or list(row.approvers)
    if row.escalated_at is None:
        return first
    targets = escalation_targets(policy, policy.approvals_for(row.team))
    return first + [t for t in targets if t not in first and t in row.approvers]


def remind(ctx: Context, session: Session, row: RequestRow, *, now: datetime, actor: str) -> None:
    """A reply in the thread of every card that landed, and a DM to each person asked whose
    card is not in their own DM. `actor`: the bot (a step of the clock) or the requester."""
    subject = f"request:{row.id}"
    cards = outbox.landed(session, subject, [OutboxKind.APPROVAL_CARD])
    for card in cards:
        if card.channel and card.ts:
            data = {"request": row.id, "thread_ts": card.ts, "by": actor}
            owe(session, Owed(OutboxKind.APPROVAL_REMINDER, subject, card.channel, data), at=now)
    in_dm = {card.recipient for card in cards}
    people = asked(ctx.policy, row)
    for person in people:
        if person not in in_dm:
            data = {"request": row.id, "by": actor}
            owe(session, Owed(OutboxKind.APPROVAL_REMINDER, subject, person, data), at=now)
    if actor == SYSTEM:
        row.reminders += 1
        row.reminded_at = now
        tag = AuditTag.REQUEST_REMINDED
    else:
        row.nudged_at = now
        tag = AuditTag.REQUEST_NUDGED
    session.add(row)
    detail = {"reminder": row.reminders, "asked": people, "threads": len(cards)}
    record(session, at=now, actor=actor, tag=tag, subject=subject, outcome="pending", detail=detail)


def escalate(
    ctx: Context, session: Session, row: RequestRow, settings: Approvals, *, now: datetime
) -> None:
    """A new card for each escalation target that has none yet; the people among them (and the
    admins, for a channel) may settle the request; every card says it was escalated. The next
    reminder counts from now."""
    subject = f"request:{row.id}"
    targets = escalation_targets(ctx.policy, settings)
    carded = {
        card.recipient
        for card in outbox.owed_about(session, subject)
        if card.kind == OutboxKind.APPROVAL_CARD
    }
    carded |= {row.approval_route} if row.approval_route.startswith(("C", "G")) else set()
    row.approvers = [
        *row.approvers,
        *(t for t in escalation_settlers(ctx.policy, targets) if t not in row.approvers),
    ]
    row.escalated_at = now
    if row.reminders:
        row.reminded_at = now  # the new card is a reminder too: the next one waits its turn
    session.add(row)
    for target in targets:
        if target not in carded:
            owe(
                session,
                Owed(OutboxKind.APPROVAL_CARD, subject, target, {"request": row.id}),
                at=now,
            )
    notices.redraw(session, notices.card_redrawn(row, by=""), at=now, again=True)
    record(
        session,
        at=now,
        actor=SYSTEM,
        tag=AuditTag.REQUEST_ESCALATED,
        subject=subject,
        outcome="pending",
        detail={"to": targets, "after_s": int((now - row.created_at).total_seconds())},
    )


def expire(
    ctx: Context, session: Session, row: RequestRow, settings: Approvals, *, now: datetime
) -> bool:
    """Withdraw a request nobody decided; while automation is paused, only record that it
    would have been (once per pause). False: paused, nothing was withdrawn."""
    subject = f"request:{row.id}"
    after = format_duration(settings.expire_after)
    why = f"nobody decided within {after}"
    if admin.is_paused(session, ctx):
        text = f"R{row.id} of <@{row.requester}> would have expired: {why}."
        admin.would_have(
            session,
            ctx,
            tag=AuditTag.REQUEST_WOULD_HAVE,
            subject=subject,
            outcome="would expire",
            text=text,
            at=now,
        )
        return False
    row.state, row.decided_at, row.decided_by = RequestState.CANCELLED, now, SYSTEM
    session.add(row)
    record(
        session,
        at=now,
        actor=SYSTEM,
        tag=AuditTag.REQUEST_EXPIRED,
        subject=subject,
        outcome="cancelled",
        detail={"why": why, "after_s": int(settings.expire_after.total_seconds())},
    )
    reason = f"Expired after {after}, nobody decided"
    notices.settled(session, row, by=SYSTEM, verdict="expired", reason=reason, at=now)
    return True


def _too_late(ctx: Context, session: Session, row: RequestRow) -> datetime | None:
    """For an extension: from the last expiry warning before its lease ends, an answer comes
    too late to be of use, so it is escalated then."""
    if row.kind != RequestKind.EXTEND or row.lease_id is None:
        return None
    lease = leases.get(session, row.lease_id)
    if lease is None or lease.ended_at is not None:
        return None
    leads = ctx.policy.timing.expiry_leads
    return lease.expires_at - (leads[-1] if leads else timedelta(minutes=10))


def _to_tell(ctx: Context, session: Session, row: RequestRow, now: datetime) -> LeaseRow | None:
    """The lease of an extension whose holder is owed "it still waits" now, else None."""
    if row.kind != RequestKind.EXTEND or row.told_at is not None or row.lease_id is None:
        return None
    lease = leases.get(session, row.lease_id)
    if lease is None or lease.ended_at is not None:
        return None
    when = tell_at(row.created_at, lease.expires_at, ctx.policy.timing.expiry_leads)
    return lease if when is not None and when <= now else None


def _tell_if_lease_ends_soon(
    ctx: Context, session: Session, row: RequestRow, now: datetime
) -> bool:
    """Tell an extension's holder once, at the first expiry warning after it was filed, that
    the extension still waits and the lease ends unless it is approved."""
    lease = _to_tell(ctx, session, row, now)
    if lease is None:
        return False
    subject = f"request:{row.id}"
    data = {"request": row.id, "to": REQUESTER}
    owe(session, Owed(OutboxKind.APPROVAL_REMINDER, subject, row.requester, data), at=now)
    row.told_at = now
    session.add(row)
    record(
        session,
        at=now,
        actor=SYSTEM,
        tag=AuditTag.REQUEST_STILL_PENDING,
        subject=subject,
        outcome="pending",
        detail={"lease": lease.id, "ends_at": lease.expires_at.isoformat()},
    )
    return True


def nudge(ctx: Context, user: str, request_id: int) -> Nudged | TooSoon | Refused:
    """The requester's "Remind approvers": the same reminder at once, at most once every
    NUDGE_EVERY per request."""
    now = ctx.now()
    with ctx.db.write() as session:
        row = requests.lock(session, request_id)
        if row is None or row.requester != user:
            return Refused(f"R{request_id} is not a request of yours.", "not-yours")
        if row.state != RequestState.PENDING:
            return Refused(f"R{request_id} no longer waits for anyone: it is {row.state}.")
        if row.nudged_at is not None and now - row.nudged_at < NUDGE_EVERY:
            return TooSoon(request_view(row), now - row.nudged_at, row.nudged_at + NUDGE_EVERY)
        remind(ctx, session, row, now=now, actor=user)
        people = tuple(asked(ctx.policy, row))
        return Nudged(request_view(row), people, now, now + NUDGE_EVERY)


def ask_again(ctx: Context, user: str, request_id: int) -> BorrowResult | AskedAgain | Refused:
    """*Ask again* on an expired request: the same borrow filed once more, once. The old
    request is locked while the new one is filed and remembers it, so a second click (or a
    retry) answers with the request filed the first time."""
    with ctx.db.write() as session:
        row = requests.lock(session, request_id)
        if row is None or row.requester != user:
            return Refused(f"R{request_id} is not a request of yours.", "not-yours")
        if row.kind != RequestKind.BORROW:
            return Refused(f"R{request_id} was an extension; `/gpu extend` asks again.")
        if row.asked_again_id is not None:
            again = requests.get(session, row.asked_again_id)
            assert again is not None
            waiting = again.state == RequestState.PENDING
            return AskedAgain(
                request_view(again), tuple(asked(ctx.policy, again) if waiting else ())
            )
        if not _expired(session, row):
            return Refused(
                f"Only an expired request can be asked again; R{request_id} is {row.state}. "
                "`/gpu borrow` asks for GPUs anew.",
                "not-expired",
            )
        ask = borrowing.BorrowAsk(
            row.pool,
            row.gpus,
            timedelta(seconds=row.duration_s),
            priority=Priority(row.priority),
            reason=row.reason,
        )
        result = borrowing.borrow(ctx, user, ask, within=session)
        if isinstance(result, BorrowResult):
            row.asked_again_id = result.request.id
            session.add(row)
            record(
                session,
                at=ctx.now(),
                actor=user,
                tag=AuditTag.REQUEST_ASKED_AGAIN,
                subject=f"request:{request_id}",
                outcome=result.request.state,
                detail={"request": result.request.id},
            )
        return result


def _expired(session: Session, row: RequestRow) -> bool:
    """Was this request withdrawn because nobody decided it in time (`expire`)?"""
    if row.state != RequestState.CANCELLED or row.decided_by != SYSTEM:
        return False
    return any(
        r.tag == AuditTag.REQUEST_EXPIRED for r in audit.history(session, f"request:{row.id}")
    )


def waiting_for(session: Session, ctx: Context, user: str) -> list[RequestView]:
    """The pending requests and extensions `user` may decide, oldest first (not their own)."""
    del ctx  # the policy is not needed today: who may decide is stored on each request
    return [
        request_view(r)
        for r in sorted(requests.pending(session), key=lambda r: (r.created_at, r.id or 0))
        if user in r.approvers and user != r.requester
    ]
