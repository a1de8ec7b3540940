"""Past leases written in bulk, with their requests, approvals, GPUs, audit rows and hourly
usage: how the demo seeds two weeks of history in a fraction of a second."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from rules.domain import RequestState
from storage import audit
from storage.audit import AuditEntry, AuditTag
from storage.tables import (
    ApprovalRow,
    GpuHourRow,
    GpuRow,
    LeaseGpuRow,
    LeaseRow,
    NodeRow,
    RequestRow,
)

_TAG_OF = {"approve": "approved", "ask": "asked", "queue": "queued"}


@dataclass(frozen=True)
class PastRequest:
    """A settled borrow or extension: the rules' outcome, and who settled it when (the
    approver of an `ask`; the bot for the rest)."""

    kind: str  # borrow | extend
    gpus: int
    duration_s: int
    outcome: str  # approve | ask | queue
    deciding_rule: str
    created_at: datetime
    decided_at: datetime
    decided_by: str
    approvers: tuple[str, ...] = ()
    approval_route: str = ""


@dataclass(frozen=True)
class PastEvent:
    """Something that happened to a lease after its grant, for the audit log."""

    at: datetime
    actor: str
    tag: AuditTag
    outcome: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PastLease:
    holder: str
    team: str
    pool: str
    gpus: tuple[tuple[str, int], ...]  # (node, index)
    reason: str
    granted_at: datetime
    expires_at: datetime
    ended_at: datetime
    state: str  # released | reclaimed
    end_reason: str
    borrow: PastRequest
    extension: PastRequest | None = None
    events: tuple[PastEvent, ...] = ()  # warnings, a recall, the reclaim or release, in order
    protected: bool = False


@dataclass(frozen=True)
class PastHour:
    """One GPU's hour (a `gpu_hour` row); `lease` is the position of its lease in the leases
    written with it, None for an hour no lease held."""

    hour: datetime
    pool: str
    node: str
    index: int
    lease: int | None
    allocated_s: float = 0.0
    used_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    unknown_s: float = 0.0
    unreserved_s: float = 0.0
    memory_peak_mib: int | None = None


def write(
    session: Session, leases: Sequence[PastLease], hours: Sequence[PastHour], *, mark: str
) -> list[int]:
    """Insert `leases` (ended: their GPUs no longer active) with their requests, approvals and
    audit rows, then `hours`. Every audit row's detail says `seeded: mark`. Returns the lease
    ids, in the order of `leases`."""
    lease_ids = _insert(session, LeaseRow, [_lease_values(past) for past in leases])
    settled = [
        (past, lease_id, request)
        for past, lease_id in zip(leases, lease_ids, strict=True)
        for request in (past.borrow, past.extension)
        if request is not None
    ]
    request_ids = _insert(
        session, RequestRow, [_request_values(p, r, lease_id) for p, lease_id, r in settled]
    )
    gpu_of = _gpu_ids(session)
    held = [
        {"lease_id": lease_id, "gpu_id": gpu_of[slot], "active": False}
        for past, lease_id in zip(leases, lease_ids, strict=True)
        for slot in past.gpus
    ]
    if held:
        session.execute(sa.insert(LeaseGpuRow), held)
    approvals = [
        {"request_id": rid, "approver": r.decided_by, "verdict": "approve", "at": r.decided_at}
        for rid, (_, _, r) in zip(request_ids, settled, strict=True)
        if r.outcome == "ask"
    ]
    if approvals:
        session.execute(sa.insert(ApprovalRow), approvals)
    entries: list[tuple[datetime, AuditEntry, int | None]] = []
    for rid, (past, lease_id, request) in zip(request_ids, settled, strict=True):
        entries += _request_entries(past, request, rid, lease_id, mark)
    for past, lease_id in zip(leases, lease_ids, strict=True):
        entries += [(e.at, _lease_entry(e, lease_id, mark), None) for e in past.events]
    entries.sort(key=lambda entry: entry[0])
    audit_ids = audit.append_all(session, [(entry, at) for at, entry, _ in entries])
    decided = [
        {"rid": rid, "aid": aid}
        for (_, _, rid), aid in zip(entries, audit_ids, strict=True)
        if rid is not None
    ]
    if decided:
        _request = RequestRow.__table__  # type: ignore[attr-defined]  # SQLModel sets it
        stmt = sa.update(_request).where(_request.c.id == sa.bindparam("rid"))
        session.execute(stmt.values(audit_id=sa.bindparam("aid")), decided)
    if hours:
        by_lease = dict(enumerate(zip(leases, lease_ids, strict=True)))
        session.execute(sa.insert(GpuHourRow), [_hour_values(h, by_lease) for h in hours])
    return lease_ids


def _insert(session: Session, table: type[Any], rows: list[dict[str, Any]]) -> list[int]:
    """Insert `rows` in one statement; their new ids, in the order given."""
    if not rows:
        return []
    stmt = sa.insert(table).returning(table.id, sort_by_parameter_order=True)
    return [int(row_id) for row_id in session.execute(stmt, rows).scalars()]


def _gpu_ids(session: Session) -> dict[tuple[str, int], int]:
    stmt = select(NodeRow.name, GpuRow.index, GpuRow.id).join(
        NodeRow, col(NodeRow.id) == col(GpuRow.node_id)
    )
    return {(node, index): gpu_id for node, index, gpu_id in session.exec(stmt) if gpu_id}


def _lease_values(past: PastLease) -> dict[str, Any]:
    extension = past.extension
    return {
        "holder": past.holder,
        "team": past.team,
        "pool": past.pool,
        "gpus": len(past.gpus),
        "priority": "normal",
        "protected": past.protected,
        "reason": past.reason,
        "state": past.state,
        "granted_at": past.granted_at,
        "expires_at": past.expires_at,
        "ended_at": past.ended_at,
        "end_reason": past.end_reason,
        "extensions": 1 if extension else 0,
        "extended_s": extension.duration_s if extension else 0,
        "warnings": {},
    }


def _request_values(past: PastLease, request: PastRequest, lease_id: int) -> dict[str, Any]:
    return {
        "kind": request.kind,
        "requester": past.holder,
        "team": past.team,
        "pool": past.pool,
        "gpus": request.gpus,
        "duration_s": request.duration_s,
        "priority": "normal",
        "reason": past.reason,
        "state": RequestState.APPROVED,
        "outcome": request.outcome,
        "approvers": list(request.approvers),
        "approval_route": request.approval_route,
        "lease_id": lease_id,
        "created_at": request.created_at,
        "decided_at": request.decided_at,
        "decided_by": request.decided_by,
    }


def _request_entries(
    past: PastLease, request: PastRequest, request_id: int, lease_id: int, mark: str
) -> list[tuple[datetime, AuditEntry, int | None]]:
    """The rules' decision (the row the request points at), a manager's approval, and the
    grant or the extension it led to."""
    seeded = {"seeded": mark}
    subject = f"request:{request_id}"
    decision = AuditEntry(
        actor=past.holder,
        tag=f"{request.kind}:{_TAG_OF[request.outcome]}",
        subject=subject,
        outcome=request.outcome,
        deciding_rule=request.deciding_rule,
        matching_rules=(request.deciding_rule,),
        detail={"gpus": request.gpus, "pool": past.pool, "duration_s": request.duration_s} | seeded,
    )
    entries: list[tuple[datetime, AuditEntry, int | None]] = [
        (request.created_at, decision, request_id)
    ]
    if request.outcome == "ask":
        approved = AuditEntry(
            actor=request.decided_by,
            tag=f"{request.kind}:approved",
            subject=subject,
            outcome="approve",
            detail={"by": request.decided_by} | seeded,
        )
        entries.append((request.decided_at, approved, None))
    if request.kind == "extend":
        before = past.expires_at - timedelta(seconds=request.duration_s)
        moved = AuditEntry(
            actor=request.decided_by,
            tag=AuditTag.LEASE_EXTENDED,
            subject=f"lease:{lease_id}",
            outcome="active",
            detail={
                "request": request_id,
                "from": before.isoformat(),
                "to": past.expires_at.isoformat(),
                "extensions": 1,
            }
            | seeded,
        )
        return [*entries, (request.decided_at, moved, None)]
    granted = AuditEntry(
        actor=request.decided_by,
        tag=AuditTag.LEASE_GRANTED,
        subject=f"lease:{lease_id}",
        outcome="active",
        detail={
            "request": request_id,
            "holder": past.holder,
            "gpus": [f"{node}:{index}" for node, index in past.gpus],
            "expires_at": past.expires_at.isoformat(),
        }
        | seeded,
    )
    return [*entries, (past.granted_at, granted, None)]


def _lease_entry(event: PastEvent, lease_id: int, mark: str) -> AuditEntry:
    return AuditEntry(
        actor=event.actor,
        tag=event.tag,
        subject=f"lease:{lease_id}",
        outcome=event.outcome,
        detail={**event.detail, "seeded": mark},
    )


def _hour_values(hour: PastHour, leases: Mapping[int, tuple[PastLease, int]]) -> dict[str, Any]:
    held = leases.get(hour.lease) if hour.lease is not None else None
    return {
        "hour": hour.hour,
        "pool": hour.pool,
        "node": hour.node,
        "index": hour.index,
        "team": held[0].team if held else "",
        "holder": held[0].holder if held else "",
        "lease_id": held[1] if held else 0,
        "allocated_s": hour.allocated_s,
        "used_s": hour.used_s,
        "busy_s": hour.busy_s,
        "idle_s": hour.idle_s,
        "unknown_s": hour.unknown_s,
        "unreserved_s": hour.unreserved_s,
        "memory_peak_mib": hour.memory_peak_mib,
    }
