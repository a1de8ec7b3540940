"""Fair share among borrowers: each team's weight and decayed past usage in a pool, read for
the queue's order and for `/gpu quota` (rules.fairshare decides; this reads)."""

from __future__ import annotations

from sqlmodel import Session

from bot.services.context import Context
from bot.services.results import FairShareUse
from rules.fairshare import Share, decay_rate, shares
from storage.leases import decayed_use
from storage.requests import per_transaction

# Usage older than this many half-lives counts less than 2 % of its weight: it is not read.
HALF_LIVES_READ = 6


def pool_shares(ctx: Context, session: Session, pool: str) -> dict[str, Share]:
    """The fair share of every team with a quota in `pool`, from the GPU-hours its leases held
    (decayed by `queue.fair_share_half_life`). With fair share off, every usage is 0. Read
    once while the transaction changes nothing: `/gpu queue` orders the queue by it and shows
    it too. Shared: not to be changed."""
    return per_transaction(session, ("fair shares", pool), lambda: _shares(ctx, session, pool))


def _shares(ctx: Context, session: Session, pool: str) -> dict[str, Share]:
    spec = ctx.policy.pools.get(pool)
    if spec is None:
        return {}
    half_life = ctx.policy.queue.fair_share_half_life
    usage: dict[str, float] = {}
    if half_life:
        now = ctx.now()
        since = now - HALF_LIVES_READ * half_life
        # each lease's term computed by the database: the window holds thousands of leases
        usage = decayed_use(session, pool, since, now, decay_rate(half_life))
    return shares(spec.quotas, usage)


def pool_uses(ctx: Context, session: Session, pool: str) -> dict[str, FairShareUse]:
    """Each team's fair share in the pool as people read it (empty: fair share is off)."""
    half_life = ctx.policy.queue.fair_share_half_life
    if not half_life:
        return {}
    out = {}
    for team, share in pool_shares(ctx, session, pool).items():
        weights = share.weight / share.weight_share
        out[team] = FairShareUse(
            share.weight, weights, share.weight_share, share.usage, share.usage_share, half_life
        )
    return out
