"""Read-only answers: pool status, quota use, the queue, and a person's App Home."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta

from sqlmodel import Session

from bot.services import approval_lifecycle
from bot.services.context import Context
from bot.services.fair_share import pool_uses
from bot.services.grants import queue_of
from bot.services.reads import list_leases, list_requests, request_view
from bot.services.results import (
    FairShareUse,
    Fleet,
    Home,
    ModelCount,
    PoolStatus,
    QuotaUse,
    RequestView,
    TeamWork,
    UnreservedGpu,
    WeekUse,
)
from rules.domain import Reporting, RequestState
from rules.reports import Usage
from storage import nodes, reports
from storage.gpus import Place, occupied_lines, place_counts, stranded
from storage.leases import held_by_team
from storage.metrics import one_snapshot
from storage.reports import Filter
from storage.requests import pending, pools_with_queue, queued_count, queued_sizes
from storage.tables import RequestRow
from storage.usage import held_usage, rolled_until


def pool_status(session: Session, ctx: Context) -> list[PoolStatus]:
    """Every pool of the rules: free, leased, occupied without a lease, not reporting and
    out-of-service GPUs by model (storage.gpus.Place: the definition placement uses), counted
    in SQL."""
    counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    # place_counts moves the drained nodes' GPUs out of a count of every GPU, in two statements:
    # on PostgreSQL they must see one snapshot, or a GPU changing meanwhile is counted twice
    one_snapshot(session)
    for found in place_counts(session):
        tally = counts[found.pool][found.model or "GPU"]
        tally[found.place] += found.gpus
        if found.drained and found.place == Place.OUT:
            tally["drained"] += found.gpus
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
                drained=c["drained"],
            )
            for model, c in sorted(counts[name].items())
        )
        queued = queued_count(session, name)
        stranded = _stranded(session, name) if queued else 0
        out.append(PoolStatus(name, pool.protected, pool.size, models, queued, stranded))
    return out


def _stranded(session: Session, pool: str) -> int:
    """Fragmentation: free GPUs on nodes too empty for even the smallest waiting request."""
    waiting = queued_sizes(session, pool)
    if not waiting:
        return 0
    return stranded(session, pool, min(waiting))


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
        used = held_by_team(session, name).get(team, 0)
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


#: How far back a Home's "last 7 days" line looks.
WEEK = timedelta(days=7)
#: A stored minute counts as busy from this average utilisation on (the telemetry window's
#: idle threshold).
BUSY_PCT = 5.0


def home(session: Session, ctx: Context, user: str, *, paused: bool) -> Home:
    """What one person's Home shows: their own GPUs for everyone; what waits for their
    decision and their teams' work for managers; the fleet for admins."""
    team = ctx.policy.team_of(user)
    mine = list_requests(session, requester=user)
    admin = ctx.policy.is_admin(user)
    return Home(
        user=user,
        team=team.name if team else None,
        leases=tuple(list_leases(session, holder=user)),
        requests=tuple(mine),
        quotas=tuple(quota_use(session, ctx, team.name)) if team else (),
        pools=tuple(pool_status(session, ctx)),
        paused=paused,
        admin=admin,
        places=_places(session, ctx, [r for r in mine if r.state == RequestState.QUEUED]),
        week=week_use(session, ctx, user, ctx.now()),
        waiting=tuple(waiting_for(session, ctx, user)),
        managed=tuple(_managed(session, ctx, user)),
        fleet=fleet(session, ctx) if admin else None,
    )


def pending_for(session: Session, user: str) -> list[RequestRow]:
    """Requests waiting for this person's decision."""
    return [r for r in pending(session) if user in r.approvers]


def waiting_for(session: Session, ctx: Context, user: str) -> list[RequestView]:
    """What waits for this person's Approve or Deny (borrows and extensions), oldest first:
    the approval lifecycle's own list, the one read the Home's "Waiting for you" is drawn from."""
    return approval_lifecycle.waiting_for(session, ctx, user)


def week_use(session: Session, ctx: Context, user: str, now: datetime) -> WeekUse:
    """What `user` held in the last 7 days: the whole hours the hourly rollups hold, and the
    rest (the part of the first hour inside the window, and the hours not rolled up yet) from
    the per-minute history, counted the same way."""
    prices = {n: p.cost_per_gpu_hour for n, p in ctx.policy.pools.items() if p.cost_per_gpu_hour}
    since = now - WEEK
    first_whole = min(_ceil_hour(since), now)
    rolled = min(
        rolled_until(session) or first_whole, now.replace(minute=0, second=0, microsecond=0)
    )

    def minutes(start: datetime, end: datetime) -> Usage:
        return held_usage(session, user, start, end, busy_pct=BUSY_PCT, prices=prices)

    if rolled <= first_whole:
        usage = minutes(since, now)
    else:
        hourly = reports.usage(
            session, first_whole, rolled, Filter(holder=user), None, prices=prices
        )
        usage = minutes(since, first_whole) + hourly.get("", Usage()) + minutes(rolled, now)
    currency = ctx.policy.reports.currency
    return WeekUse(usage, currency, priced=bool(prices) and usage.cost > 0)


def _ceil_hour(at: datetime) -> datetime:
    hour = at.replace(minute=0, second=0, microsecond=0)
    return hour if hour == at else hour + timedelta(hours=1)


def fleet(session: Session, ctx: Context) -> Fleet:
    """Drained and not-reporting nodes, GPUs busy without a lease, and the queue."""
    every = nodes.every_node(session)
    unreserved = tuple(
        UnreservedGpu(line.node, line.index, line.pool, line.occupants)
        for line in occupied_lines(session)
    )
    return Fleet(
        drained=tuple(sorted(n.name for n in every if n.drained)),
        silent=tuple(sorted(n.name for n in every if n.reporting == Reporting.SILENT)),
        unreserved=unreserved,
        queue=tuple(queue(session, ctx)),
    )


def _managed(session: Session, ctx: Context, user: str) -> list[TeamWork]:
    teams = sorted(t.name for t in ctx.policy.teams.values() if user in t.managers)
    if not teams:
        return []
    leases = list_leases(session)
    open_requests = list_requests(session)
    return [
        TeamWork(
            name,
            tuple(lease for lease in leases if lease.team == name),
            tuple(r for r in open_requests if r.team == name),
        )
        for name in teams
    ]


def _places(session: Session, ctx: Context, queued: list[RequestView]) -> dict[int, int]:
    """Each queued request's place in its pool's queue (1: served next)."""
    places: dict[int, int] = {}
    for pool in sorted({r.pool for r in queued}):
        order = [row.id for row, _ in queue_of(ctx, session, pool)]
        for request in queued:
            if request.pool == pool and request.id in order:
                places[request.id] = order.index(request.id) + 1
    return places
