"""Lender recall, applied: mark the leases `rules.recall.plan` chooses, withdraw the ones it no
longer needs, and explain both. The sweep rules then warn (`warn preempt`) and, after the
delivered warning and the notice period, reclaim (`reclaim preempted`) through the usual path
with the usual invariants; this module never ends a lease itself.

A recall is kept on the lease (`Marks.recall`: when, for which request, and why), so the
sweep, `/gpu queue`, `/gpu why` and the approval cards all read the same record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session

from bot.services import admin, notices, queueing
from bot.services.context import Context, record
from bot.services.fair_share import pool_uses
from bot.services.grants import decide, facts_now, owed_to, queue_of, waiting_guarantees
from bot.services.reads import request_view
from bot.services.results import ApprovalEffects, HeldFor, PassedOver, QueueEntry, Recall, Recalled
from rules import recall
from rules.domain import Outcome, RequestKind, RequestState
from rules.marks import RECALL
from rules.policy import Pool
from rules.queueing import Slot
from storage import audit, homes, requests
from storage import leases as storage_leases
from storage.audit import AuditEntry, AuditTag
from storage.gpus import free_count
from storage.leases import PoolLease
from storage.pools import lock as lock_pool
from storage.requests import held_now, ordered_queue, pools_with_queue
from storage.tables import (
    LeaseRow,
    RequestRow,
)

RECALLER = "gpubot"


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
    cooled: dict[str, datetime]  # holder -> last preempted or warned, within the cooldown
    leases: dict[int, PoolLease]
    requests: dict[int, RequestRow]  # the queued ones, by id
    # usable GPUs of leases ending within recall.notice, not recalled and not protected: they
    # come back before a recall could, so nobody is preempted for them
    soon: int = 0
    order: tuple[tuple[RequestRow, bool], ...] = ()  # the queue in serving order
    # GPUs each team holds in the pool, given when `holdings` are only the leases the plan
    # touches (rules.recall.touched); None: `holdings` are all of them
    used: Mapping[str, int] | None = None

    @property
    def coming(self) -> int:
        """What recall counts as free: the free GPUs and those that come back soon."""
        return self.free + self.soon


def picture(
    ctx: Context, session: Session, pool: str, now: datetime, *, planned: str = ""
) -> PoolPicture:
    """The pool as recall sees it. `planned`, for a picture that is only planned from (no
    lease is added to it): its holdings are only the leases the plan touches, read alone (with
    those coming back soon, which it counts), the same plan as over every lease for a fraction
    of the work in a large pool; "read" also orders the queue without fair share, "shown"
    with it (the order people see)."""
    by = now + ctx.policy.recall.notice
    spec = ctx.policy.pools[pool]
    within = ctx.policy.preemption.by_priority
    used = held_now(session, pool) if planned and not within else None
    # Fair share orders only the requests beyond their nominal, after every one inside it:
    # the guarantees, all a plan without preemption within a team reads of the queue, come
    # in the same order without it (rules.queueing.queue_order), and its usage is not read.
    if used is not None and planned == "read":
        ordered = ordered_queue(session, ctx.policy, pool)
    else:
        ordered = queue_of(ctx, session, pool)
    if used is not None:
        # of each team above its nominal, only the leases that hold its borrowed GPUs
        borrowing = [
            lease
            for team in used
            if recall.touched_team(team, used, spec.quotas)
            for lease in storage_leases.borrowing(session, pool, team, _beyond(team, used, spec))
        ]
        leases = storage_leases.pool_leases(
            session, pool, teams=(), ids=borrowing, ending=(now, by)
        )
    else:
        leases = queueing.pool_leases(session, pool)
    every = [_holding(row, spec.protected) for row in leases]
    soon = sum(
        h.returns
        for h, row in zip(every, leases, strict=True)
        if not h.protected and h.recalled_at is None and now < row.expires_at <= by
    )
    holdings = (
        tuple(h for h in every if recall.touched(h, used, spec.quotas, within))
        if used is not None
        else tuple(every)
    )
    return PoolPicture(
        holdings,
        tuple(_waiting(r, now) for r, _ in ordered),
        free_count(session, pool),
        _cooled(session, now - ctx.policy.recall.cooldown),
        {row.id: row for row in leases},
        {r.id or 0: r for r, _ in ordered},
        soon,
        tuple(ordered),
        used,
    )


def _beyond(team: str, used: Mapping[str, int], spec: Pool) -> int:
    """The GPUs `team` holds beyond its nominal in the pool."""
    quota = spec.quotas.get(team)
    return used.get(team, 0) - (quota.nominal if quota is not None else 0)


def _holding(row: PoolLease, protected_pool: bool) -> recall.Holding:
    protected = row.protected or protected_pool
    if row.marks.raw.get(RECALL) is None:  # (most leases of a pool: no recall's marks)
        return recall.Holding(
            row.id,
            row.holder,
            row.team,
            row.gpus,
            row.priority,
            row.granted_at,
            protected,
            usable=row.usable,
        )
    return recall.Holding(
        lease=row.id,
        holder=row.holder,
        team=row.team,
        gpus=row.gpus,
        priority=row.priority,
        granted_at=row.granted_at,
        protected=protected,
        recalled_at=row.marks.recalled_at,
        recalled_for=row.marks.recalled_for,
        usable=row.usable,
        within_team=row.marks.recalled_within_team,
    )


def _waiting(request: RequestRow, now: datetime) -> recall.Waiting:
    waited = now - (request.created_at or now)
    return recall.Waiting(
        request.id or 0, request.team, request.gpus, waited=waited, priority=request.priority
    )


def _cooled(session: Session, since: datetime) -> dict[str, datetime]:
    """Holders preempted since `since`, or warned of a preemption that was then withdrawn (in
    every pool), each with when it last happened (`since` where the record does not say)."""
    cooled = storage_leases.last_preempted_since(session, since)
    withdrawn = audit.details_since(session, AuditTag.LEASE_RECALL_WITHDRAWN, since)
    for d in withdrawn:
        if not (d.get("warned") and d.get("holder")):
            continue
        at = datetime.fromisoformat(str(d["at"])) if d.get("at") else since
        holder = str(d["holder"])
        cooled[holder] = max(at, cooled.get(holder, at))
    return cooled


def plan_for(ctx: Context, seen: PoolPicture, pool: str, now: datetime) -> recall.Plan:
    quotas = ctx.policy.pools[pool].quotas
    return recall.plan(
        quotas,
        seen.holdings,
        seen.queue,
        seen.coming,
        now=now,
        recall=ctx.policy.recall,
        cooled=seen.cooled,
        within_team=ctx.policy.preemption.by_priority,
        used=seen.used,
    )


def reconcile(ctx: Context, pools: Iterable[str] | None = None) -> RecallReport:
    """Bring each pool's recalls in step with its queue: start, keep or withdraw."""
    report = RecallReport()
    for pool in sorted(pools) if pools is not None else sorted(ctx.policy.pools):
        if pool not in ctx.policy.pools:
            continue
        now = ctx.now()
        with ctx.db.write() as session:
            lock_pool(session, pool)
            if _settled(session, pool):
                continue
            seen = picture(ctx, session, pool, now, planned="read")
            plan = plan_for(ctx, seen, pool, now)
            # Paused automation starts no recall (the kill switch); withdrawing one is safe.
            paused = admin.is_paused(session, ctx)
            if paused:
                admin.would_recall(session, ctx, plan.start, now)
            # the leases the plan changes, read in one go (the picture holds plain columns)
            rows = storage_leases.by_id(
                session,
                [v.lease for v in (*plan.start, *plan.reassign)] + list(plan.withdraw),
            )
            for victim in () if paused else plan.start:
                _start(session, rows[victim.lease], victim, now)
                report.started.append(f"L{victim.lease}")
            _reassign(session, [(rows[v.lease], v) for v in plan.reassign], now)
            for lease_id in plan.withdraw:
                _withdraw(session, rows[lease_id], now)
                report.withdrawn.append(f"L{lease_id}")
    return report


def _settled(session: Session, pool: str) -> bool:
    """Nothing to start, reassign or withdraw: nobody queues in the pool and no lease in it
    is being recalled (the common case, told by two cheap reads instead of a whole picture)."""
    return not requests.any_queued(session, pool) and not storage_leases.any_recalled(session, pool)


def _start(session: Session, row: LeaseRow, victim: recall.Victim, now: datetime) -> None:
    row.warnings = row.warnings.with_recall(
        at=now,
        request=victim.request,
        team=victim.for_team,
        because=victim.because,
        within_team=victim.within_team,
    )
    session.add(row)
    record(
        session,
        at=now,
        actor=RECALLER,
        tag=AuditTag.LEASE_RECALLED,
        subject=f"lease:{row.id}",
        outcome="recall",
        detail={
            "request": victim.request,
            "for_team": victim.for_team,
            "because": victim.because,
            "gpus": row.gpus,
            "within_team": victim.within_team,
        },
    )


def _reassign(session: Session, moved: list[tuple[LeaseRow, recall.Victim]], now: datetime) -> None:
    """Recalls that stand for another waiting request: each record says whom it serves. When
    the queue moves up, every recall under way may move with it (hundreds in a large pool):
    their audit rows are appended under one lock of the chain's head, in the plan's order,
    each as `record` writes it."""
    entries = []
    for row, victim in moved:
        row.warnings = row.warnings.with_recall_for(request=victim.request, team=victim.for_team)
        session.add(row)
        subject = f"lease:{row.id}"
        homes.touch(session, subject)  # (as `record` notes it)
        detail = {"request": victim.request, "for_team": victim.for_team, "because": victim.because}
        entry = AuditEntry(
            actor=RECALLER,
            tag=AuditTag.LEASE_RECALL_REASSIGNED,
            subject=subject,
            outcome="recall",
            detail=detail,
        )
        entries.append((entry, now))
    audit.append_all(session, entries)


def _withdraw(session: Session, row: LeaseRow, now: datetime) -> None:
    # Only a delivered warning was heard; one still in the outbox is dropped unsent, as the
    # warning it stood for is gone.
    warned = queueing.delivered_at(session, row.warnings.warning_outbox("preempt")) is not None
    row.warnings = row.warnings.without_recall()
    session.add(row)
    why = "the GPUs it was recalled for came free another way, or nobody waits for them any more"
    record(
        session,
        at=now,
        actor=RECALLER,
        tag=AuditTag.LEASE_RECALL_WITHDRAWN,
        subject=f"lease:{row.id}",
        outcome="keep",
        # A warning the holder had to heed counts for the cooldown, as a preemption would.
        detail={"why": why, "warned": warned, "holder": row.holder, "at": now.isoformat()},
    )
    if warned:  # the holder was told it would be taken: tell them it stays
        notices.recall_withdrawn(session, row, at=now)


def effects_of_approval(ctx: Context, session: Session, request: RequestRow) -> ApprovalEffects:
    """What approving `request` would do now: whom it overtakes, which leases it recalls."""
    now = ctx.now()
    seen = picture(ctx, session, request.pool, now)
    waiting = [w.request for w in seen.queue if w.request != request.id]
    if request.kind != RequestKind.BORROW:
        return ApprovalEffects(queued=len(waiting))
    # What the rules say once a person approves (as the approval itself will ask them).
    facts = facts_now(ctx, session, request)
    decision = decide(ctx, facts)
    if decision.verdict is not None and decision.verdict.outcome == Outcome.DENY:
        return ApprovalEffects(queued=len(waiting), refused=decision.because)
    held = decision.once_approved() == Outcome.QUEUE
    waits_for = next(
        (m.because for m in decision.matches if m.verdict.outcome == Outcome.QUEUE), ""
    )
    paused = admin.is_paused(session, ctx)
    held_for = _held_for(ctx, session, request) if int(str(facts["team.borrowed_after"])) else ()
    before = {v.lease for v in plan_for(ctx, seen, request.pool, now).start}
    quotas, rules = ctx.policy.pools[request.pool].quotas, ctx.policy.recall
    if request.gpus <= seen.free and not held:
        # Granted at once, ahead of whoever waits; the GPUs it takes may be the ones a
        # waiting guarantee counted on, and then more borrowed leases are recalled.
        granted = recall.Holding(
            -1, request.requester, request.team, request.gpus, request.priority, now, False
        )
        after = recall.plan(
            quotas,
            (*seen.holdings, granted),
            seen.queue,
            seen.coming - request.gpus,
            now=now,
            recall=rules,
            cooled=seen.cooled,
            within_team=ctx.policy.preemption.by_priority,
        )
        return ApprovalEffects(
            queued=len(waiting),
            overtakes=tuple(waiting),
            recalls=() if paused else _new(after, before),
            notice=rules.notice,
            paused=paused,
            held_for=held_for,
            preempts=() if paused else _new(after, before, within_team=True),
        )
    # It would join the queue at its place and recall what its guarantee needs (a pending
    # request has no place yet: it is ordered among the queue as if it had one).
    placed = [r for r, _ in queue_of(ctx, session, request.pool, extra=request)]
    queue = tuple(_waiting(r, now) for r in placed)
    after = recall.plan(
        quotas,
        seen.holdings,
        queue,
        seen.coming,
        now=now,
        recall=rules,
        cooled=seen.cooled,
        within_team=ctx.policy.preemption.by_priority,
    )
    return ApprovalEffects(
        queued=len(waiting),
        waits=True,
        behind=tuple(r.id or 0 for r in placed[: placed.index(request)]),
        recalls=() if paused else _new(after, before),
        notice=rules.notice,
        waits_for=waits_for if held else "",
        paused=paused,
        held_for=held_for,
        preempts=() if paused else _new(after, before, within_team=True),
    )


def _held_for(ctx: Context, session: Session, request: RequestRow) -> tuple[HeldFor, ...]:
    """The lenders' waiting guarantees a borrow may not take GPUs from."""
    return tuple(
        HeldFor(r.id or 0, r.team, r.gpus) for r in waiting_guarantees(ctx, session, request)
    )


def _new(
    after: recall.Plan, before: set[int], *, within_team: bool = False
) -> tuple[Recalled, ...]:
    """The recalls a plan starts that the pool would not start anyway: of borrowed leases, or
    (`within_team`) of the lower-priority leases of a request's own team."""
    return tuple(
        Recalled(v.lease, v.holder, v.gpus, v.team)
        for v in after.start
        if v.lease not in before and v.within_team == within_team
    )


def queue_entries(ctx: Context, session: Session) -> list[QueueEntry]:
    """Every queued borrow, pool by pool in queue order, with its place, its expected start
    and its reasons."""
    now = ctx.now()
    out: list[QueueEntry] = []
    for pool in sorted(pools_with_queue(session)):
        if pool not in ctx.policy.pools:
            continue
        seen = picture(ctx, session, pool, now, planned="shown")
        out += _pool_entries(ctx, session, pool, seen, plan_for(ctx, seen, pool, now))
    return out


def _pool_entries(
    ctx: Context, session: Session, pool: str, seen: PoolPicture, plan: recall.Plan
) -> list[QueueEntry]:
    under_way = tuple(
        Recall(
            Recalled(h.lease, h.holder, h.gpus, h.team),
            queueing.taken_at(session, seen.leases[h.lease].marks, ctx.policy.recall.notice),
            h.recalled_for,
            within_team=h.within_team,
        )
        for h in sorted(seen.holdings, key=lambda h: h.lease)
        if h.recalled_at is not None
    )
    recalls: dict[int, list[Recall]] = {}
    for r in under_way:
        recalls.setdefault(r.request, []).append(r)
    # what every guarantee counts on, added up once for the whole queue
    owed = owed_to(row for row, inside in seen.order if inside)
    passed = passed_over(seen, plan)
    slots = queueing.slots(ctx, session, pool)
    shares = pool_uses(ctx, session, pool)
    heads: dict[str, int] = {}
    wait = ctx.policy.pools[pool].limits.max_queue_wait
    out = []
    for position, waiting in enumerate(seen.queue, start=1):
        row = seen.requests[waiting.request]
        head = heads.setdefault(row.team, waiting.request)
        guaranteed = waiting.request in plan.guaranteed
        slot = slots.get(waiting.request)
        out.append(
            QueueEntry(
                request=request_view(row),
                position=position,
                head=f"R{head}" if head != waiting.request else "",
                waits_for=_waits_for(ctx, session, row, slot, seen.order, owed=owed),
                free=seen.free,
                guaranteed=guaranteed,
                recalls=tuple(recalls.get(row.id or 0, ())),
                withdrawn_at=(row.decided_at or row.created_at) + wait,
                passed_over=passed if guaranteed else (),
                passed_within=_passed(seen, plan.passed_within.get(waiting.request, {})),
                expected_start=slot.start if slot else None,
                for_gpus=slot.for_gpus if slot else True,
                share=None if guaranteed else shares.get(row.team),
                backfill=ctx.policy.queue.backfill.value,
            )
        )
    return out


def passed_over(seen: PoolPicture, plan: recall.Plan) -> tuple[PassedOver, ...]:
    """The borrowed leases the plan could not recall, with why, by lease id."""
    return _passed(seen, plan.passed_over)


def _passed(seen: PoolPicture, why: Mapping[int, str]) -> tuple[PassedOver, ...]:
    if not why:
        return ()  # (most requests of a long queue: no lease by id is needed)
    by_id = {h.lease: h for h in seen.holdings}
    return tuple(
        PassedOver(Recalled(h.lease, h.holder, h.gpus, h.team), why[h.lease])
        for h in (by_id[lease] for lease in sorted(why))
    )


def waiting_guarantee(
    ctx: Context, session: Session, request: RequestRow
) -> tuple[PassedOver, ...] | None:
    """For a queued request inside its team's nominal: the borrowed leases recall passes over
    for it now (maybe none). None when it is not such a request."""
    if request.state != RequestState.QUEUED or request.pool not in ctx.policy.pools:
        return None
    # A guarantee is a request inside its team's nominal, which the queue's order already
    # says (the plan finds the same ones): only for one is the whole pool weighed.
    # (whether a request is inside its nominal does not depend on fair share: not read here)
    if not any(
        inside and row.id == request.id
        for row, inside in ordered_queue(session, ctx.policy, request.pool)
    ):
        return None
    now = ctx.now()
    seen = picture(ctx, session, request.pool, now, planned="read")
    plan = plan_for(ctx, seen, request.pool, now)
    if request.id not in plan.guaranteed:
        return None
    return passed_over(seen, plan)


def _waits_for(
    ctx: Context,
    session: Session,
    row: RequestRow,
    slot: Slot | None,
    order: Iterable[tuple[RequestRow, bool]],
    *,
    owed: Mapping[str, int],
) -> str:
    """Why a queued request waits, as the rules see it now (not when it was decided)."""
    ahead = len(slot.delays) if slot else 0
    facts = facts_now(ctx, session, row, ahead=ahead, queue=order, owed=owed)
    decision = decide(ctx, facts)
    if decision.verdict is not None and decision.verdict.outcome == Outcome.DENY:
        return f"the rules would now refuse it: {decision.because}"
    holding = [
        m.because for m in decision.matches if not m.observe and m.verdict.outcome == Outcome.QUEUE
    ]
    if holding:
        return holding[0]
    return "nothing holds it back any more: it is granted at the next pass of the queue"
