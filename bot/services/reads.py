"""Rows as the views the use cases answer with: a lease with its GPUs, a request, lists."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlmodel import Session

from bot.services.results import GpuSlot, LeaseView, RequestView
from rules.domain import LeaseState
from storage import leases, requests
from storage.leases import slots_of
from storage.tables import LeaseRow, RequestRow


def lease_view(
    session: Session, lease: LeaseRow, slots: Sequence[tuple[str, int]] | None = None
) -> LeaseView:
    """A lease with its GPUs (the GPUs it holds, or held once it ended; `slots`: those, when
    the caller read them)."""
    assert lease.id is not None
    if slots is None:
        slots = slots_of(session, lease.id)
    return LeaseView(
        id=lease.id,
        holder=lease.holder,
        team=lease.team,
        pool=lease.pool,
        gpus=tuple(sorted(GpuSlot(node, index) for node, index in slots)),
        state=lease.state,
        priority=lease.priority,
        protected=lease.protected,
        reason=lease.reason,
        granted_at=lease.granted_at,
        expires_at=lease.expires_at,
        extensions=lease.extensions,
        extended=timedelta(seconds=lease.extended_s),
        ended_at=lease.ended_at,
        end_reason=lease.end_reason,
        recalled_for=_recalled_for(lease),
        recalled_within_team=lease.warnings.recalled_within_team,
    )


def _recalled_for(lease: LeaseRow) -> str:
    mark = lease.warnings.recall if lease.state == LeaseState.ACTIVE else None
    if mark is None:
        return ""
    return f"{mark.get('team')} (R{mark.get('request')})"


def request_view(request: RequestRow) -> RequestView:
    assert request.id is not None
    return RequestView(
        id=request.id,
        kind=request.kind,
        requester=request.requester,
        team=request.team,
        pool=request.pool,
        gpus=request.gpus,
        duration=timedelta(seconds=request.duration_s),
        priority=request.priority,
        reason=request.reason,
        state=request.state,
        outcome=request.outcome,
        approvers=tuple(request.approvers),
        approval_route=request.approval_route,
        lease_id=request.lease_id,
        created_at=request.created_at,
        decided_at=request.decided_at,
        decided_by=request.decided_by,
        escalated_at=request.escalated_at,
        reminders=request.reminders,
    )


def list_leases(
    session: Session, *, active_only: bool = True, holder: str | None = None
) -> list[LeaseView]:
    """Leases, newest first; by default only the active ones."""
    rows = leases.listed(session, active_only=active_only, holder=holder)
    slots = leases.slots_of_each(session, [row.id for row in rows if row.id is not None])
    return [lease_view(session, row, slots.get(row.id or 0, [])) for row in rows]


def list_requests(
    session: Session, *, open_only: bool = True, requester: str | None = None
) -> list[RequestView]:
    rows = requests.listed(session, open_only=open_only, requester=requester)
    return [request_view(row) for row in rows]
