"""Read-only answers: pool status, quota use, the queue, and a person's App Home."""

from __future__ import annotations

from collections import Counter, defaultdict

from sqlmodel import Session

from bot.services.context import Context
from bot.services.fair_share import pool_uses
from bot.services.grants import queue_of
from bot.services.reads import list_leases, list_requests, request_view
from bot.services.results import (
    FairShareUse,
    Home,
    ModelCount,
    PoolStatus,
    QuotaUse,
    RequestView,
)
from storage.gpus import Place, free_gpus, gpu_lines
from storage.pools import pool_usage
from storage.requests import pending, pools_with_queue, queued_sizes
from storage.tables import RequestRow


def pool_status(session: Session, ctx: Context) -> list[PoolStatus]:
    """Every pool of the rules: free, leased, occupied without a lease, not reporting and
    out-of-service GPUs by model (storage.gpus.gpu_lines: the definition placement uses)."""
    counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for line in gpu_lines(session):
        counts[line.pool][line.model or "GPU"][line.place] += 1
    out = []
    for name, pool in ctx.policy.pools.items():
        models = tuple(
            ModelCount(
                model,
                free=c[Place.FREE],
                leased=c[Place.LEASED],
                unhealthy=c[Place.OUT] + c[Place.SILENT],
                occupied=c[Place.OCCUPIED],
                silent=c[Place.SILENT],
            )
            for model, c in sorted(counts[name].items())
        )
        queued = pool_usage(session, name).queued
        stranded = _stranded(session, name) if queued else 0
        out.append(PoolStatus(name, pool.protected, pool.size, models, queued, stranded))
    return out


def _stranded(session: Session, pool: str) -> int:
    """Fragmentation: free GPUs on nodes too empty for even the smallest waiting request."""
    waiting = queued_sizes(session, pool)
    if not waiting:
        return 0
    need = min(waiting)
    return sum(len(free) for free in free_gpus(session, pool).values() if len(free) < need)


def quota_use(
    session: Session, ctx: Context, team: str, *, fair_share: bool = False
) -> list[QuotaUse]:
    """The team's quota and use in every pool where it has a quota; with `fair_share` (and
    fair share on in the rules), its share and recent use of each pool too."""
    out = []
    for name, pool in ctx.policy.pools.items():
        quota = pool.quotas.get(team)
        if quota is None:
            continue
        used = pool_usage(session, name).held.get(team, 0)
        share = _fair_share(session, ctx, name, team) if fair_share else None
        out.append(
            QuotaUse(
                team, name, quota.nominal, quota.borrowing_limit, quota.lending_limit, used, share
            )
        )
    return out


def _fair_share(session: Session, ctx: Context, pool: str, team: str) -> FairShareUse | None:
    """The team's fair share in the pool (None: fair share is off)."""
    return pool_uses(ctx, session, pool).get(team)


def queue(session: Session, ctx: Context) -> list[RequestView]:
    """Requests waiting for GPUs, pool by pool, in the order they will be served: those inside
    their team's nominal first, then priority, then arrival."""
    pools = pools_with_queue(session)
    return [request_view(row) for pool in sorted(pools) for row, _ in queue_of(ctx, session, pool)]


def home(session: Session, ctx: Context, user: str, *, paused: bool) -> Home:
    team = ctx.policy.team_of(user)
    return Home(
        user=user,
        team=team.name if team else None,
        leases=tuple(list_leases(session, holder=user)),
        requests=tuple(list_requests(session, requester=user)),
        quotas=tuple(quota_use(session, ctx, team.name)) if team else (),
        pools=tuple(pool_status(session, ctx)),
        paused=paused,
    )


def pending_for(session: Session, user: str) -> list[RequestRow]:
    """Requests waiting for this person's decision."""
    return [r for r in pending(session) if user in r.approvers]
