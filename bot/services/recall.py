"""Lender recall, applied: mark the leases `rules.recall.plan` chooses, withdraw the ones it no
longer needs, and explain both. The sweep rules then warn (`warn preempt`) and, after the
delivered warning and the notice period, reclaim (`reclaim preempted`) through the usual path
with the usual invariants; this module never ends a lease itself.

A recall is kept on the lease (`warnings["recall"]`: when, for which request, and why), so the
sweep, `/gpu queue`, `/gpu why` and the approval cards all read the same record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, col, select

from bot.services import notices
from bot.services.borrowing import _lock_pool
from bot.services.context import Context, record
from bot.services.queries import free_gpus, request_view
from bot.services.views import ApprovalEffects, QueueEntry, Recall, Recalled
from rules import recall
from rules.domain import LeaseState, Priority, RequestKind, RequestState
from storage import audit
from storage.tables import LeaseRow, OutboxRow, RequestRow

RECALLER = "gpubot"
KEY = "recall"


@dataclass
class RecallReport:
    started: list[str] = field(default_factory=list)
    withdrawn: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PoolPicture:
    """One pool as recall sees it, read in one transaction."""

    holdings: tuple[recall.Holding, ...]
    queue: tuple[recall.Waiting, ...]
    free: int
    cooled: frozenset[str]
    rows: dict[int, LeaseRow]


def queue_order(rows: Iterable[RequestRow]) -> list[RequestRow]:
    """The documented order: priority (high first), then arrival."""

    def rank(r: RequestRow) -> int:
        try:
            return -Priority(r.priority).rank
        except ValueError:
            return -Priority.NORMAL.rank

    return sorted(rows, key=lambda r: (rank(r), r.created_at, r.id or 0))


def recalled_at(row: LeaseRow) -> datetime | None:
    mark = row.warnings.get(KEY)
    if not isinstance(mark, dict) or "at" not in mark:
        return None
    return datetime.fromisoformat(str(mark["at"]))


def picture(ctx: Context, session: Session, pool: str, now: datetime) -> PoolPicture:
    leases = session.exec(
        select(LeaseRow).where(LeaseRow.pool == pool, LeaseRow.state == LeaseState.ACTIVE)
    ).all()
    protected_pool = ctx.policy.pools[pool].protected
    holdings = tuple(
        recall.Holding(
            lease=row.id or 0,
            holder=row.holder,
            team=row.team,
            gpus=row.gpus,
            priority=row.priority,
            granted_at=row.granted_at,
            protected=row.protected or protected_pool,
            recalled_at=recalled_at(row),
        )
        for row in leases
    )
    waiting = session.exec(
        select(RequestRow).where(
            RequestRow.pool == pool,
            RequestRow.state == RequestState.QUEUED,
            RequestRow.kind == RequestKind.BORROW,
        )
    ).all()
    queue = tuple(recall.Waiting(r.id or 0, r.team, r.gpus) for r in queue_order(waiting))
    since = now - ctx.policy.recall.cooldown
    cooled = session.exec(
        select(LeaseRow.holder).where(
            LeaseRow.end_reason == "preempted", col(LeaseRow.ended_at) >= since
        )
    ).all()
    free = sum(len(v) for v in free_gpus(session, pool).values())
    return PoolPicture(
        holdings, queue, free, frozenset(cooled), {row.id or 0: row for row in leases}
    )


def plan_for(ctx: Context, seen: PoolPicture, pool: str, now: datetime) -> recall.Plan:
    quotas = ctx.policy.pools[pool].quotas
    return recall.plan(
        quotas,
        seen.holdings,
        seen.queue,
        seen.free,
        now=now,
        recall=ctx.policy.recall,
        cooled=seen.cooled,
    )


def pools_with_queue(session: Session) -> set[str]:
    found = session.exec(
        select(RequestRow.pool)
        .where(RequestRow.state == RequestState.QUEUED, RequestRow.kind == RequestKind.BORROW)
        .distinct()
    ).all()
    return set(found)


def reconcile(ctx: Context, pools: Iterable[str] | None = None) -> RecallReport:
    """Bring each pool's recalls in step with its queue: start, keep or withdraw."""
    report = RecallReport()
    for pool in sorted(pools) if pools is not None else sorted(ctx.policy.pools):
        if pool not in ctx.policy.pools:
            continue
        now = ctx.now()
        with ctx.db.write() as session:
            _lock_pool(session, pool)
            seen = picture(ctx, session, pool, now)
            plan = plan_for(ctx, seen, pool, now)
            for victim in plan.start:
                _start(session, seen.rows[victim.lease], victim, now)
                report.started.append(f"L{victim.lease}")
            for lease_id in plan.withdraw:
                _withdraw(session, seen.rows[lease_id], now)
                report.withdrawn.append(f"L{lease_id}")
    return report


def _start(session: Session, row: LeaseRow, victim: recall.Victim, now: datetime) -> None:
    mark = {
        "at": now.isoformat(),
        "request": victim.request,
        "team": victim.for_team,
        "because": victim.because,
    }
    row.warnings = {**row.warnings, KEY: mark}
    session.add(row)
    record(
        session,
        at=now,
        actor=RECALLER,
        tag="lease:recalled",
        subject=f"lease:{row.id}",
        outcome="recall",
        detail={
            "request": victim.request,
            "for_team": victim.for_team,
            "because": victim.because,
            "gpus": row.gpus,
        },
    )


def _withdraw(session: Session, row: LeaseRow, now: datetime) -> None:
    warned = "preempt" in row.warnings
    row.warnings = {k: v for k, v in row.warnings.items() if k not in (KEY, "preempt")}
    session.add(row)
    why = "the GPUs it was recalled for came free another way, or nobody waits for them any more"
    record(
        session,
        at=now,
        actor=RECALLER,
        tag="lease:recall-withdrawn",
        subject=f"lease:{row.id}",
        outcome="keep",
        detail={"why": why},
    )
    if warned:  # the holder was told it would be taken: tell them it stays
        notices.recall_withdrawn(session, row, at=now)


def effects_of_approval(ctx: Context, session: Session, request: RequestRow) -> ApprovalEffects:
    """What approving `request` would do now: whom it overtakes, which leases it recalls."""
    now = ctx.now()
    seen = picture(ctx, session, request.pool, now)
    free = seen.free
    waiting = [w.request for w in seen.queue if w.request != request.id]
    if request.kind != RequestKind.BORROW:
        return ApprovalEffects(queued=len(waiting))
    if request.gpus <= free:  # granted at once, ahead of whoever is waiting
        return ApprovalEffects(queued=len(waiting), overtakes=tuple(waiting))
    # It would join the queue at its place and recall what its guarantee needs.
    placed = queue_order([*_rows(session, waiting), request])
    # (a pending request has no place yet: it is ordered among the queue as if it had one)
    queue = tuple(recall.Waiting(r.id or 0, r.team, r.gpus) for r in placed)
    quotas = ctx.policy.pools[request.pool].quotas
    hypothetical = recall.plan(
        quotas, seen.holdings, queue, free, now=now, recall=ctx.policy.recall, cooled=seen.cooled
    )
    before = plan_for(ctx, seen, request.pool, now)
    already = {v.lease for v in before.start}
    recalls = tuple(
        Recalled(v.lease, v.holder, v.gpus, v.team)
        for v in hypothetical.start
        if v.lease not in already
    )
    ahead = tuple(r.id or 0 for r in placed[: placed.index(request)])
    return ApprovalEffects(
        queued=len(waiting),
        waits=True,
        behind=ahead,
        recalls=recalls,
        notice=ctx.policy.recall.notice,
    )


def queue_entries(ctx: Context, session: Session) -> list[QueueEntry]:
    """Every queued borrow, pool by pool in queue order, with its place and its reasons."""
    now = ctx.now()
    out: list[QueueEntry] = []
    for pool in sorted(pools_with_queue(session)):
        if pool not in ctx.policy.pools:
            continue
        seen = picture(ctx, session, pool, now)
        plan = plan_for(ctx, seen, pool, now)
        under_way = tuple(
            Recall(
                Recalled(h.lease, h.holder, h.gpus, h.team),
                _taken_at(ctx, session, seen.rows[h.lease]),
            )
            for h in sorted(seen.holdings, key=lambda h: h.lease)
            if h.recalled_at is not None
        )
        rows = {r.id: r for r in _rows(session, [w.request for w in seen.queue])}
        head = f"R{seen.queue[0].request}" if seen.queue else ""
        wait = ctx.policy.pools[pool].limits.max_queue_wait
        for position, waiting in enumerate(seen.queue, start=1):
            row = rows[waiting.request]
            guaranteed = waiting.request in plan.guaranteed
            out.append(
                QueueEntry(
                    request=request_view(row),
                    position=position,
                    head=head if position > 1 else "",
                    waits_for=_because(session, row),
                    free=seen.free,
                    guaranteed=guaranteed,
                    recalls=under_way if guaranteed else (),
                    withdrawn_at=row.created_at + wait,
                )
            )
    return out


def _because(session: Session, row: RequestRow) -> str:
    found = audit.get(session, row.audit_id) if row.audit_id else None
    return str(found.detail.get("because", "")) if found else ""


def _taken_at(ctx: Context, session: Session, row: LeaseRow) -> datetime | None:
    """The earliest a recalled lease is reclaimed: its warning's delivery plus the notice."""
    sent = row.warnings.get("preempt")
    if not isinstance(sent, dict) or "outbox" not in sent:
        return None
    owed = session.get(OutboxRow, int(sent["outbox"]))
    if owed is None or owed.delivered_at is None:
        return None
    return owed.delivered_at + ctx.policy.recall.notice


def _rows(session: Session, ids: list[int]) -> list[RequestRow]:
    if not ids:
        return []
    return list(session.exec(select(RequestRow).where(col(RequestRow.id).in_(ids))).all())
