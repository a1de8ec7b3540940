"""Extending and releasing leases: only the holder or an admin may do either."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from bot.services import notices
from bot.services.context import Context, record
from bot.services.reads import lease_view, request_view
from bot.services.results import LeaseView, Refused, ReleaseResult, ended_how, reader_time
from rules.domain import LeaseState, RequestState
from storage import leases as storage_leases
from storage import requests as storage_requests
from storage.audit import AuditTag
from storage.requests import open_requests_for
from storage.tables import LeaseRow, RequestRow


def to_change(ctx: Context, session: Session, user: str, lease_id: int) -> LeaseRow | Refused:
    """The active lease `user` may change (its holder, or an admin), locked; or why not."""
    lease = storage_leases.lock(session, lease_id)
    if lease is None:
        return Refused(f"There is no lease L{lease_id}.", "no-lease")
    refused = _mine(ctx, user, lease)
    if refused is not None and refused.code == "not-active":
        _outdated(session, lease, now=ctx.now())
    return refused or lease


def _mine(ctx: Context, user: str, lease: LeaseRow) -> Refused | None:
    if user != lease.holder and not ctx.policy.is_admin(user):
        return Refused(
            f"L{lease.id} is held by <@{lease.holder}>; only they or an admin may change it.",
            "not-yours",
        )
    if lease.state != LeaseState.ACTIVE:
        when = f" {reader_time(lease.ended_at)}" if lease.ended_at else ""
        how = ended_how(
            lease.state, lease.end_reason, within_team=lease.warnings.recalled_within_team
        )
        return Refused(
            f"L{lease.id} ended{when}: {how}. Nothing is left to change; `/gpu borrow` asks again.",
            "not-active",
        )
    return None


def _outdated(session: Session, lease: LeaseRow, *, now: datetime) -> None:
    """A button on a DM about a lease that has ended: make sure its DMs say so."""
    if LeaseState(lease.state).is_final and lease.ended_at is not None:
        notices.redraw(session, notices.closed(lease, by=""), at=now)


def release(ctx: Context, user: str, lease_id: int | None = None) -> ReleaseResult | Refused:
    """Give GPUs back: one lease, or (lease_id None) every lease and open request of `user`."""
    now = ctx.now()
    with ctx.db.write() as session:
        if lease_id is not None:
            lease = to_change(ctx, session, user, lease_id)
            if isinstance(lease, Refused):
                return lease
            leases = [lease]
            requests: list[RequestRow] = []
        else:
            leases = storage_leases.lock_active_of(session, user)
            requests = open_requests_for(session, user)
            if not leases and not requests:
                return Refused("You hold no active lease and have no open request.", "nothing")
        released = []
        for lease in leases:
            released.append(
                end_lease(session, lease, LeaseState.RELEASED, "released", actor=user, now=now)
            )
            if user != lease.holder:
                notices.ended_by_other(session, lease, by=user, at=now)
        for request in requests:
            if not RequestState(request.state).is_open:
                continue  # an extension of a lease just released, withdrawn with it
            if request.approval_route:  # its cards must say it was withdrawn
                notices.settled(
                    session,
                    request,
                    by=user,
                    verdict="cancel",
                    reason="",
                    at=now,
                    tell_requester=False,
                )
            request.state, request.decided_at, request.decided_by = (
                RequestState.CANCELLED,
                now,
                user,
            )
            session.add(request)
            record(
                session,
                at=now,
                actor=user,
                tag=AuditTag.REQUEST_CANCELLED,
                subject=f"request:{request.id}",
                outcome="cancelled",
            )
        return ReleaseResult(tuple(released), tuple(request_view(r) for r in requests))


def end_lease(
    session: Session, lease: LeaseRow, state: LeaseState, why: str, *, actor: str, now: datetime
) -> LeaseView:
    """End a lease and free its GPUs in one step (the active-GPU index is released too).

    The messages that offered its buttons are redrawn to say how it ended, and an extension
    still waiting for a manager is withdrawn: there is nothing left to extend."""
    lease.state, lease.ended_at, lease.end_reason = state, now, why
    session.add(lease)
    storage_leases.let_go(session, lease.id)
    session.flush()
    record(
        session,
        at=now,
        actor=actor,
        tag=AuditTag(f"lease:{state.value}"),
        subject=f"lease:{lease.id}",
        outcome=state.value,
        detail={"why": why},
    )
    notices.lease_closed(session, lease, by=actor, at=now)
    _withdraw_extensions(session, lease, actor=actor, now=now)
    notices.waiting_cards(session, lease.pool, at=now, besides=None)
    return lease_view(session, lease)


def _withdraw_extensions(session: Session, lease: LeaseRow, *, actor: str, now: datetime) -> None:
    """Close the extensions of an ended lease still waiting for a person, and say why."""
    assert lease.id is not None
    how = ended_how(lease.state, lease.end_reason, within_team=lease.warnings.recalled_within_team)
    why = f"L{lease.id} ended ({how}) before anyone answered"
    for request in storage_requests.lock_pending_extensions(session, lease.id):
        request.state, request.decided_at, request.decided_by = RequestState.CANCELLED, now, actor
        session.add(request)
        record(
            session,
            at=now,
            actor=actor,
            tag=AuditTag.EXTEND_WITHDRAWN,
            subject=f"request:{request.id}",
            outcome="cancelled",
            detail={"lease": lease.id, "why": why},
        )
        notices.settled(session, request, by=actor, verdict="withdrawn", reason=why, at=now)


def snooze(ctx: Context, user: str, lease_id: int) -> LeaseView | Refused:
    """The "Still using" button: no idle warning or reclaim for a while, a limited number of
    times; the idle (or partly-idle) warning that was standing is withdrawn."""
    timing = ctx.policy.timing
    now = ctx.now()
    with ctx.db.write() as session:
        lease = to_change(ctx, session, user, lease_id)
        if isinstance(lease, Refused):
            return lease
        if lease.snoozes >= timing.max_snoozes:
            return Refused(
                f"L{lease_id} was already kept {lease.snoozes} times, the most allowed. "
                f"If the GPUs are busy the idle warning will not come back; if not, release "
                f"them or `/gpu extend L{lease_id}` to keep the time.",
                "snoozes",
            )
        lease.snoozes += 1
        lease.snoozed_until = now + timing.snooze
        lease.warnings = lease.warnings.without("idle", "partly_idle")
        session.add(lease)
        record(
            session,
            at=now,
            actor=user,
            tag=AuditTag.LEASE_SNOOZED,
            subject=f"lease:{lease.id}",
            outcome="snoozed",
            detail={"until": lease.snoozed_until.isoformat(), "snoozes": lease.snoozes},
        )
        notices.lease_changed(session, lease.id, lease.holder, at=now)  # the warning answered
        return lease_view(session, lease)
