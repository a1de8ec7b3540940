"""Reads the use cases share: rows to views, pool usage, free GPUs by node."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum

import sqlalchemy as sa
from sqlmodel import Session, col, select

from bot.services.views import GpuSlot, LeaseView, RequestView
from rules.domain import GpuState, LeaseState, Observed, RequestKind, RequestState
from rules.facts import PoolUsage
from rules.policy import Policy
from rules.recall import Queued, queue_order
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, RequestRow


def lease_view(session: Session, lease: LeaseRow) -> LeaseView:
    """A lease with its GPUs (the GPUs it holds, or held once it ended)."""
    assert lease.id is not None
    slots = session.exec(
        select(NodeRow.name, GpuRow.index)
        .join(GpuRow, col(GpuRow.node_id) == col(NodeRow.id))
        .join(LeaseGpuRow, col(LeaseGpuRow.gpu_id) == col(GpuRow.id))
        .where(LeaseGpuRow.lease_id == lease.id)
    ).all()
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
    )


def _recalled_for(lease: LeaseRow) -> str:
    mark = lease.warnings.get("recall") if lease.state == LeaseState.ACTIVE else None
    if not isinstance(mark, dict):
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
    )


def list_leases(
    session: Session, *, active_only: bool = True, holder: str | None = None
) -> list[LeaseView]:
    """Leases, newest first; by default only the active ones."""
    stmt = select(LeaseRow).order_by(col(LeaseRow.id).desc())
    if active_only:
        stmt = stmt.where(LeaseRow.state == LeaseState.ACTIVE)
    if holder is not None:
        stmt = stmt.where(LeaseRow.holder == holder)
    return [lease_view(session, row) for row in session.exec(stmt).all()]


def list_requests(
    session: Session, *, open_only: bool = True, requester: str | None = None
) -> list[RequestView]:
    stmt = select(RequestRow).order_by(col(RequestRow.id))
    if open_only:
        stmt = stmt.where(col(RequestRow.state).in_([RequestState.PENDING, RequestState.QUEUED]))
    if requester is not None:
        stmt = stmt.where(RequestRow.requester == requester)
    return [request_view(row) for row in session.exec(stmt).all()]


def pool_usage(session: Session, pool: str, free: dict[str, list[int]] | None = None) -> PoolUsage:
    """GPUs held per team, free GPUs and waiting requests in one pool, right now (`free`:
    the pool's free GPUs when the caller already read them in this transaction)."""
    held = held_by_team(session, pool)
    queued = session.exec(
        select(sa.func.count())
        .select_from(RequestRow)
        .where(RequestRow.pool == pool, RequestRow.state == RequestState.QUEUED)
    ).one()
    count = sum(len(v) for v in (free if free is not None else free_gpus(session, pool)).values())
    return PoolUsage(held=held, free=count, queued=int(queued))


def held_by_team(session: Session, pool: str) -> dict[str, int]:
    """GPUs held per team in active leases of one pool."""
    rows = session.exec(
        select(LeaseRow.team, sa.func.sum(LeaseRow.gpus))
        .where(LeaseRow.pool == pool, LeaseRow.state == LeaseState.ACTIVE)
        .group_by(col(LeaseRow.team))
    ).all()
    return {str(team): int(n) for team, n in rows}


class Place(StrEnum):
    """Where a GPU stands for placement: one name, used by placement, status, Home, the fleet
    panel and the rules' `pool.free`."""

    FREE = "free"  # healthy, undrained, in no active lease, telemetry shows it empty (or unknown)
    LEASED = "leased"
    OCCUPIED = "occupied"  # a process or memory in use, and no lease covers it
    SILENT = "silent"  # not reporting
    OUT = "out"  # unhealthy or drained


@dataclass(frozen=True)
class GpuLine:
    node: str
    index: int
    pool: str
    model: str
    place: Place
    observed: str
    lease_id: int | None
    occupants: tuple[str, ...]  # the Unix users seen on it ("" when unnamed)
    id: int = 0
    state: str = GpuState.OK  # the inventory's own state (rules.domain.GpuState)
    drained: bool = False  # its node is drained


def gpu_lines(session: Session, pool: str | None = None) -> list[GpuLine]:
    """Every GPU (of one pool) with where it stands, from one read of the inventory, the
    leases and what telemetry last showed (bot.services.devices)."""
    held = sa.and_(col(LeaseGpuRow.gpu_id) == col(GpuRow.id), col(LeaseGpuRow.active).is_(True))
    stmt = (
        sa.select(
            col(GpuRow.id),
            col(NodeRow.name),
            col(GpuRow.index),
            col(GpuRow.pool),
            col(GpuRow.model),
            col(GpuRow.state),
            col(NodeRow.drained),
            col(GpuRow.observed),
            col(GpuRow.occupants),
            col(LeaseGpuRow.lease_id),
        )
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .outerjoin(LeaseGpuRow, held)  # at most one: ix_lease_gpu_active
        .order_by(col(NodeRow.name), col(GpuRow.index))
    )
    if pool is not None:
        stmt = stmt.where(col(GpuRow.pool) == pool)
    out = []
    for (
        gpu_id,
        node,
        index,
        gpu_pool,
        model,
        state,
        drained,
        observed,
        occupants,
        lease_id,
    ) in session.connection().execute(stmt):
        if lease_id is not None:
            place = Place.LEASED
        elif drained or state != GpuState.OK:
            place = Place.OUT
        elif observed == Observed.SILENT:
            place = Place.SILENT
        elif observed == Observed.OCCUPIED:
            place = Place.OCCUPIED
        else:
            place = Place.FREE
        users = tuple(sorted({str(p.get("user") or "") for p in occupants or []}))
        line = GpuLine(node, index, gpu_pool, model, place, observed, lease_id, users)
        out.append(replace(line, id=gpu_id, state=state, drained=drained))
    return out


class FreeGpus(dict[str, list[int]]):
    """{node: free GPU indices}; `unknown` names those free GPUs without fresh telemetry,
    which placement offers last."""

    unknown: frozenset[tuple[str, int]] = frozenset()

    def adding(self, slots: Sequence[tuple[str, int]]) -> FreeGpus:
        """These free GPUs and `slots` (GPUs a person may take although they are in use)."""
        out = FreeGpus({node: list(indices) for node, indices in self.items()})
        for node, index in slots:
            if index not in out.setdefault(node, []):
                out[node].append(index)
        out.unknown = self.unknown
        return out


def free_gpus(session: Session, pool: str) -> FreeGpus:
    """The pool's free GPUs: healthy, on an undrained node, in no active lease, and telemetry
    shows no process and no memory in use beyond the floor (or has no fresh sample yet)."""
    return _free(gpu_lines(session, pool))


def _free(lines: Sequence[GpuLine]) -> FreeGpus:
    out = FreeGpus()
    unknown = set()
    for line in lines:
        if line.place == Place.FREE:
            out.setdefault(line.node, []).append(line.index)
            if line.observed != Observed.EMPTY:
                unknown.add((line.node, line.index))
    out.unknown = frozenset(unknown)
    return out


def free_for(session: Session, policy: Policy, user: str, pool: str) -> FreeGpus:
    """The pool's free GPUs as `user` may take them: the free ones, and those where only the
    user's own processes run (their own work, which their lease would cover)."""
    lines = gpu_lines(session, pool)
    return _free(lines).adding([(g.node, g.index) for g in lines if _own(policy, user, g)])


def _own(policy: Policy, user: str, line: GpuLine) -> bool:
    return (
        line.place == Place.OCCUPIED
        and bool(line.occupants)
        and all(policy.accounts.get(u) == user for u in line.occupants)
    )


def claimable(
    session: Session, policy: Policy, user: str, pool: str, slots: Sequence[tuple[str, int]]
) -> bool:
    """May `user` take exactly these GPUs of `pool`: each is free, or occupied only by processes
    of the user's own Unix accounts (the one-click borrow of one's own unreserved process)?"""
    if not slots:
        return False
    lines = {(g.node, g.index): g for g in gpu_lines(session, pool)}
    for slot in slots:
        line = lines.get(slot)
        if line is None or not (line.place == Place.FREE or _own(policy, user, line)):
            return False
    return True


def gpu_ids(session: Session, slots: list[tuple[str, int]]) -> list[int]:
    """Database ids of (node, index) slots, in the same order."""
    ids = []
    for node, index in slots:
        gpu_id = session.exec(
            select(GpuRow.id)
            .join(NodeRow, col(GpuRow.node_id) == col(NodeRow.id))
            .where(NodeRow.name == node, GpuRow.index == index)
        ).one()
        assert gpu_id is not None
        ids.append(gpu_id)
    return ids


def ordered_queue(
    session: Session, policy: Policy, pool: str, *, extra: RequestRow | None = None
) -> list[tuple[RequestRow, bool]]:
    """The pool's queued borrows in serving order (rules.recall.queue_order), each with
    whether it is inside its team's nominal; `extra`, a request not queued (yet), placed
    among them as if it were."""
    rows = list(
        session.exec(
            select(RequestRow).where(
                RequestRow.pool == pool,
                RequestRow.state == RequestState.QUEUED,
                RequestRow.kind == RequestKind.BORROW,
            )
        ).all()
    )
    if extra is not None and all(r.id != extra.id or r.id is None for r in rows):
        rows.append(extra)
    if not rows:
        return []
    quotas = policy.pools[pool].quotas if pool in policy.pools else {}
    by_id = {r.id if r.id is not None else -1: r for r in rows}
    items = [Queued(key, r.team, r.gpus, r.priority, r.created_at) for key, r in by_id.items()]
    held = held_by_team(session, pool)
    return [(by_id[q.request], inside) for q, inside in queue_order(items, held, quotas)]


def pools_with_queue(session: Session) -> set[str]:
    """The pools where borrows wait in the queue."""
    found = session.exec(
        select(RequestRow.pool)
        .where(RequestRow.state == RequestState.QUEUED, RequestRow.kind == RequestKind.BORROW)
        .distinct()
    ).all()
    return set(found)
