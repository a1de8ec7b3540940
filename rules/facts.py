"""Builders of the one flat fact each rule looks at. Derived values are computed here, in Python,
so conditions never join or compute. Durations become minutes (float)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rules.domain import Priority, RequestKind
from rules.policy import Policy, Quota

_NO_QUOTA = Quota(nominal=0, borrowing_limit=0, lending_limit=0)


def minutes(value: timedelta) -> float:
    return value.total_seconds() / 60


@dataclass(frozen=True)
class PoolUsage:
    """What the pool looks like right now: GPUs held per team, free GPUs, requests waiting."""

    held: Mapping[str, int]
    free: int
    queued: int = 0
    owed: Mapping[str, int] = field(default_factory=dict)  # per team: its waiting guarantees


def lendable(
    policy: Policy,
    pool: str,
    borrower: str,
    held: Mapping[str, int],
    owed: Mapping[str, int] | None = None,
) -> int:
    """What the borrower may still take of the other teams' unused nominal: each lender's
    unused share within its lending limit, less what the other borrowers already took.
    `owed`: per team, the GPUs its waiting requests inside nominal (guarantees) count on;
    they are not unused, so they are never lent."""
    owed = owed or {}
    lent, taken = 0, 0
    for team, quota in policy.pools[pool].quotas.items():
        if team == borrower:
            continue
        used = held.get(team, 0)
        # What a team holds beyond its nominal was lent to it; that loan counts as its
        # lenders' unused share already spent, so it never counts as unused here as well.
        lent += min(quota.lending_limit, max(0, quota.nominal - used - owed.get(team, 0)))
        taken += max(0, used - quota.nominal)
    return max(0, lent - taken)


def request_facts(
    policy: Policy,
    *,
    kind: RequestKind,
    user: str,
    team: str,
    pool: str,
    gpus: int,
    duration: timedelta,
    priority: Priority,
    has_reason: bool,
    usage: PoolUsage,
    lease_extensions: int = 0,
    lease_extended: timedelta = timedelta(0),
) -> dict[str, Any]:
    """The fact for one borrow or extend request (see the catalogue for each name)."""
    p = policy.pools[pool]
    quota = p.quotas.get(team, _NO_QUOTA)
    used = usage.held.get(team, 0)
    used_after = used + gpus if kind == RequestKind.BORROW else used
    extended_after = lease_extended + duration if kind == RequestKind.EXTEND else timedelta(0)
    return {
        "request.kind": kind.value,
        "request.gpus": gpus,
        "request.pool": pool,
        "request.duration": minutes(duration),
        "request.priority": priority.value,
        "request.priority_rank": priority.rank,
        "request.has_reason": has_reason,
        "user.id": user,
        "user.team": team,
        "user.is_manager": user in policy.teams[team].managers,
        "user.is_admin": policy.is_admin(user),
        "team.nominal": quota.nominal,
        "team.borrowing_limit": quota.borrowing_limit,
        "team.lending_limit": quota.lending_limit,
        "team.limit": quota.nominal + quota.borrowing_limit,
        "team.used": used,
        "team.used_after": used_after,
        "team.borrowed_after": max(0, used_after - quota.nominal),
        "pool.size": p.size,
        "pool.free": usage.free,
        "pool.lendable": lendable(policy, pool, team, usage.held, usage.owed),
        "pool.protected": p.protected,
        "pool.queued": usage.queued,
        "lease.extensions": lease_extensions,
        "lease.extensions_after": lease_extensions + 1 if kind == RequestKind.EXTEND else 0,
        "lease.extended": minutes(lease_extended),
        "lease.extended_after": minutes(extended_after),
        "limits.max_gpus_per_request": p.limits.max_gpus_per_request,
        "limits.max_duration": minutes(p.limits.max_duration),
        "limits.max_extensions": p.limits.max_extensions,
        "limits.max_extension_total": minutes(p.limits.max_extension_total),
    }
