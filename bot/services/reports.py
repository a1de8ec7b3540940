"""Usage reports: who may see which report, and building one from the hourly rollups.

The same rule as `/gpu why`: everyone sees their own use and their team's totals; a team's
managers see it per person; admins (and the bot itself, for digests and the CLI) see
everything: any person, team, pool and the whole lab.
"""

from __future__ import annotations

from datetime import UTC, tzinfo

from bot.services.context import SYSTEM, Context
from bot.services.results import Refused
from rules.reports import (
    Figures,
    GroupBy,
    Line,
    Report,
    Scope,
    ScopeKind,
    Usage,
    Window,
    biggest_first,
    day_keys,
    percentile,
    total,
)
from storage import keyvalue, reports
from storage.reports import Filter

#: What each scope is broken down by unless the caller asks for something else.
DEFAULT_BY: dict[ScopeKind, GroupBy] = {
    ScopeKind.ME: "pool",
    ScopeKind.USER: "pool",
    ScopeKind.TEAM: "holder",
    ScopeKind.POOL: "team",
    ScopeKind.LAB: "team",
}
_PER_PERSON: frozenset[GroupBy] = frozenset({"holder", "lease"})


def default_scope(ctx: Context, viewer: str) -> Scope:
    """What `/gpu report` with no scope shows: the lab to admins, a manager's team, else the
    person's own use."""
    policy = ctx.policy
    if viewer == SYSTEM or policy.is_admin(viewer):
        return Scope(ScopeKind.LAB)
    for team in policy.teams.values():
        if viewer in team.managers:
            return Scope(ScopeKind.TEAM, team.name)
    return Scope(ScopeKind.ME, viewer)


def build(
    ctx: Context,
    viewer: str,
    scope: Scope,
    window: Window,
    *,
    by: GroupBy | None = None,
    tz: tzinfo = UTC,
) -> Report | Refused:
    """The report `viewer` asked for, or why they may not see it (what they may see instead)."""
    if (unknown := _unknown(ctx, scope)) is not None:
        return unknown
    if scope.kind == ScopeKind.ME:
        scope = Scope(ScopeKind.ME, viewer)
    if not _may_see(ctx, viewer, scope):
        return Refused(_what_you_may_see(ctx, viewer), "not-allowed")
    grouping = by if by is not None else DEFAULT_BY[scope.kind]
    if grouping in _PER_PERSON and not _per_person(ctx, viewer, scope):
        if by is not None:
            return Refused(
                "Only the team's managers and admins see a team's use per person. "
                + _what_you_may_see(ctx, viewer),
                "not-allowed",
            )
        grouping = "pool"
    return _report(ctx, scope, window, grouping, tz)


def for_everyone(report: Report, fmt: str) -> bool:
    """May `report`, as a chart (`png`) or CSV, be shared where everyone in a channel sees it?
    Only when it holds nothing per person and nothing beyond what every member may see: a
    person's own use, or a team's totals. A CSV broken down per person or per lease, and any
    other person's, pool's or the lab's report, is for the asker alone."""
    if fmt != "png" and report.by in _PER_PERSON:
        return False
    return report.scope.kind in (ScopeKind.ME, ScopeKind.TEAM)


def _report(ctx: Context, scope: Scope, window: Window, by: GroupBy, tz: tzinfo) -> Report:
    policy = ctx.policy
    prices = {
        name: pool.cost_per_gpu_hour
        for name, pool in policy.pools.items()
        if pool.cost_per_gpu_hour is not None
    }
    where = _filter(scope)
    since, until = window.since, window.until
    with ctx.db.read() as session:
        lines, daily = reports.usage_and_days(
            session, since, until, where, by, prices=prices, tz=tz
        )
        waited = reports.waits(session, since, until, where)
        counted = reports.counts(session, since, until, where)
        waiting, oldest_s = reports.still_waiting(session, since, until, where, now=ctx.now())
        rolled = keyvalue.rolled_until(session)
    figures = Figures(
        usage=total(list(lines.values())),
        wait_p50_s=percentile(waited, 50),
        wait_p90_s=percentile(waited, 90),
        granted=len(waited),
        counts=counted,
        still_waiting=waiting,
        oldest_wait_s=oldest_s,
    )
    days = tuple(Line(day, daily.get(day, Usage())) for day in day_keys(since, until, tz))
    in_scope = [where.pool] if where.pool is not None else list(policy.pools)
    return Report(
        scope=scope,
        window=window,
        figures=figures,
        lines=biggest_first(lines),
        by=by,
        days=days,
        currency=policy.reports.currency,
        priced=any(p in prices for p in in_scope),
        # Hours are summed once they have ended: the figures stop at the first one not rolled.
        through=max(rolled, since) if rolled is not None and rolled < until else None,
    )


def _filter(scope: Scope) -> Filter:
    match scope.kind:
        case ScopeKind.ME | ScopeKind.USER:
            return Filter(holder=scope.name)
        case ScopeKind.TEAM:
            return Filter(team=scope.name)
        case ScopeKind.POOL:
            return Filter(pool=scope.name)
        case _:
            return Filter()


def _unknown(ctx: Context, scope: Scope) -> Refused | None:
    policy = ctx.policy
    if scope.kind == ScopeKind.TEAM and scope.name not in policy.teams:
        teams = ", ".join(sorted(policy.teams)) or "none yet"
        return Refused(f"There is no team `{scope.name}`; teams: {teams}.", "unknown")
    if scope.kind == ScopeKind.POOL and scope.name not in policy.pools:
        pools = ", ".join(sorted(policy.pools)) or "none yet"
        return Refused(f"There is no pool `{scope.name}`; pools: {pools}.", "unknown")
    return None


def _admin(ctx: Context, viewer: str) -> bool:
    return viewer == SYSTEM or ctx.policy.is_admin(viewer)


def _managed(ctx: Context, viewer: str) -> set[str]:
    return {t.name for t in ctx.policy.teams.values() if viewer in t.managers}


def _may_see(ctx: Context, viewer: str, scope: Scope) -> bool:
    if _admin(ctx, viewer):
        return True
    policy = ctx.policy
    match scope.kind:
        case ScopeKind.ME:
            return True
        case ScopeKind.USER:
            team = policy.team_of(scope.name)
            return scope.name == viewer or (team is not None and team.name in _managed(ctx, viewer))
        case ScopeKind.TEAM:
            own = policy.team_of(viewer)
            return scope.name in _managed(ctx, viewer) or (
                own is not None and own.name == scope.name
            )
        case _:
            return False


def _per_person(ctx: Context, viewer: str, scope: Scope) -> bool:
    """May `viewer` see this scope's use per person (or per lease)?"""
    if _admin(ctx, viewer) or scope.kind in (ScopeKind.ME, ScopeKind.USER):
        return True
    return scope.kind == ScopeKind.TEAM and scope.name in _managed(ctx, viewer)


def _what_you_may_see(ctx: Context, viewer: str) -> str:
    seen = ["your own use (`/gpu report me`)"]
    managed = sorted(_managed(ctx, viewer))
    own = ctx.policy.team_of(viewer)
    if managed:
        seen.extend(f"team {t} per person (`/gpu report team {t}`)" for t in managed)
    elif own is not None:
        seen.append(f"your team's totals (`/gpu report team {own.name}`)")
    return "You can see " + ", ".join(seen) + "; the lab and pools are for admins."
