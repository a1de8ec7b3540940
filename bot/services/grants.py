"""Granting: the GPUs of an approved request are placed best-fit and the active lease is
created; and a waiting request's facts as its pool stands now, for deciding it again.

Used by every path that grants or decides a request again: a borrow approved at once, a
manager's approval (`settling`), the queue (`queueing`) and lender recall (`recall`). Whatever
the rule files say, no grant takes a team past its quota (`rules.quota`): `decide` applies the
invariant to every request decision, and `grant` checks it once more before placing GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from sqlmodel import Session

from bot.metrics import DECISION_SECONDS
from bot.services import notices
from bot.services.context import Context, record
from bot.services.fair_share import pool_shares
from bot.services.reads import lease_view
from bot.services.results import LeaseView
from rules.decision import Decision
from rules.domain import LeaseState, Priority, RequestKind, Subject
from rules.facts import PoolUsage, lendable, request_facts
from rules.placement import place
from rules.policy import Quota
from rules.quota import enforce, exceeds
from storage.audit import AuditTag
from storage.gpus import FreeGpus, claimable, free_for, gpu_ids
from storage.leases import held_by_team, lock_gpus
from storage.pools import pool_usage
from storage.requests import ordered_queue, per_transaction
from storage.tables import LeaseGpuRow, LeaseRow, RequestRow


def grant(
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
    asked for. A grant that would break the team's quota is refused and audited."""
    if _over_quota(ctx, session, request, now, actor=actor):
        return None
    if free is None:
        placing = None if prefer else request.gpus
        free = free_for(session, ctx.policy, request.requester, request.pool, placing=placing)
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
    taken = gpu_ids(session, slots)
    lock_gpus(session, taken)  # before the held triggers write them, in the one order
    for gpu_id in taken:
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
        tag=AuditTag.LEASE_GRANTED,
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


def decide(ctx: Context, facts: dict[str, object]) -> Decision:
    """A request's decision by the rules, with the quota invariant applied."""
    with DECISION_SECONDS.time():
        return enforce(ctx.live.decide(Subject.REQUEST, facts))


def _over_quota(
    ctx: Context, session: Session, request: RequestRow, now: datetime, *, actor: str
) -> bool:
    held = held_by_team(session, request.pool)
    quotas = ctx.policy.pools[request.pool].quotas
    breach = exceeds(
        team=request.team,
        pool=request.pool,
        quota=quotas.get(request.team, Quota(nominal=0, borrowing_limit=0, lending_limit=0)),
        used=held.get(request.team, 0),
        gpus=request.gpus,
        lendable=lendable(ctx.policy, request.pool, request.team, held),
    )
    if breach is None:
        return False
    record(
        session,
        at=now,
        actor=actor,
        tag=AuditTag.QUOTA_REFUSED,
        subject=f"request:{request.id}",
        outcome=breach.outcome.value,
        detail={"because": breach.because, "gpus": request.gpus, "pool": request.pool},
    )
    return True


def facts_now(
    ctx: Context,
    session: Session,
    request: RequestRow,
    *,
    ahead: int = 0,
    queue: Iterable[tuple[RequestRow, bool]] | None = None,
    owed: Mapping[str, int] | None = None,
) -> dict[str, object]:
    """The request's facts now. `pool.queued` is what waits ahead of it and would be delayed
    by a start now: none for the head of the queue, and none for a request a person approves
    (the card said whom it overtakes). `queue`: the pool's queue, when the caller has read it;
    `owed`: `owed_to` of all its guarantees, when the caller added them up once for many
    requests (the request's own team is left out here, as `guarantees_in` leaves it out)."""

    def read() -> PoolUsage:
        free = free_for(session, ctx.policy, request.requester, request.pool, placing=0)
        return pool_usage(session, request.pool, free)

    # `/gpu queue` and a walk of the queue ask this of many requests in one transaction
    usage = per_transaction(session, ("pool usage", request.pool, request.requester), read)
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
        usage=replace(
            usage,
            queued=ahead,
            owed=_owed(ctx, session, request, queue, owed),
        ),
    )


def _owed(
    ctx: Context,
    session: Session,
    request: RequestRow,
    queue: Iterable[tuple[RequestRow, bool]] | None,
    owed: Mapping[str, int] | None,
) -> dict[str, int]:
    if owed is not None:
        return {team: gpus for team, gpus in owed.items() if team != request.team}
    if queue is None:
        return owed_to(_guarantees(ctx, session, request.pool, request.team, request.id))
    return owed_to(guarantees_in(queue, request.team, request.id))


def waiting_guarantees(ctx: Context, session: Session, request: RequestRow) -> list[RequestRow]:
    """The other teams' waiting requests inside their nominal, in queue order: what they
    count on is not lendable, so an approval must not lend it away."""
    return _guarantees(ctx, session, request.pool, request.team, besides=request.id)


def _guarantees(
    ctx: Context, session: Session, pool: str, team: str, besides: int | None = None
) -> list[RequestRow]:
    return guarantees_in(queue_of(ctx, session, pool), team, besides)


def queue_of(
    ctx: Context,
    session: Session,
    pool: str,
    *,
    extra: RequestRow | None = None,
    also_held: Mapping[str, int] | None = None,
) -> list[tuple[RequestRow, bool]]:
    """The pool's queue in serving order, fair share counted; each request with whether it is
    inside its team's nominal (see rules.queueing); `also_held`, GPUs per team counted as held
    besides its leases."""
    return ordered_queue(
        session,
        ctx.policy,
        pool,
        extra=extra,
        usage=lambda: recent_usage(ctx, session, pool),
        also_held=also_held,
    )


def recent_usage(ctx: Context, session: Session, pool: str) -> dict[str, float]:
    """Each team's recent usage of the pool in GPU-hours, decayed, for fair share (empty:
    fair share is off)."""
    if not ctx.policy.queue.fair_share_half_life:
        return {}

    def read() -> dict[str, float]:
        return {team: share.usage for team, share in pool_shares(ctx, session, pool).items()}

    # read once in a transaction that changes nothing: a decision orders the queue
    # several times, and each read goes over the pool's leases of the last weeks
    return dict(per_transaction(session, ("usage", pool), read))


def guarantees_in(
    queue: Iterable[tuple[RequestRow, bool]], team: str, besides: int | None = None
) -> list[RequestRow]:
    """Of a pool's ordered queue, the other teams' requests inside their nominal."""
    return [row for row, inside in queue if inside and row.id != besides and row.team != team]


def owed_to(guarantees: Iterable[RequestRow]) -> dict[str, int]:
    """Per lender, the GPUs its waiting guarantees count on."""
    owed: dict[str, int] = {}
    for row in guarantees:
        owed[row.team] = owed.get(row.team, 0) + row.gpus
    return owed
