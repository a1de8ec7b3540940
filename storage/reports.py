"""Reads for usage reports: sums over the hourly rollups, request waits (and the requests
still waiting), and audit counts.

A row counts in a window when its hour starts inside it. Everything is summed in SQL, grouped
by what the report breaks down by (and by pool, which prices the allocated GPU-hours).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col

from rules.domain import RequestState
from rules.reports import HOUR, Counts, GroupBy, Usage
from storage.audit import AuditTag
from storage.tables import AuditRow, GpuHourRow, LeaseRow, RequestRow


@dataclass(frozen=True)
class Filter:
    """Whose use: one holder, one team, one pool (None: any)."""

    holder: str | None = None
    team: str | None = None
    pool: str | None = None


_H = GpuHourRow.__table__.c  # type: ignore[attr-defined]
_SECONDS = (_H.allocated_s, _H.used_s, _H.busy_s, _H.idle_s, _H.unknown_s, _H.unreserved_s)
_SUMS = tuple(sa.func.sum(c) for c in _SECONDS)
_KEYS: Mapping[str, Any] = {
    "team": _H.team,
    "holder": _H.holder,
    "pool": _H.pool,
    "lease": _H.lease_id,
    "day": _H.hour,
    "hour": _H.hour,
}
#: What a breakdown is first summed by on SQLite, hour by hour: the hour and a prefix of the
#: columns after it in the window index (storage.tables.GpuHourRow), so SQLite reads the window
#: in index order and sums as it goes, where grouping the rows by the key at once sorted every
#: one of them (half a million in a month of a 1,000-GPU lab). The hours are summed away after.
_PER_HOUR: Mapping[GroupBy | None, tuple[Any, ...]] = {
    None: (_H.hour, _H.pool),
    "pool": (_H.hour, _H.pool),
    "team": (_H.hour, _H.pool, _H.team),
    "holder": (_H.hour, _H.pool, _H.team, _H.holder),
}


def usage(
    session: Session,
    since: datetime,
    until: datetime,
    where: Filter,
    by: GroupBy | None,
    *,
    prices: Mapping[str, float],
    tz: tzinfo = UTC,
) -> dict[str, Usage]:
    """GPU time per `by` key in [since, until) (one "" key when `by` is None); cost is the
    allocated GPU-hours times their pool's price (pools without one cost nothing)."""
    _room_to_group(session)
    window = (_H.hour >= since, _H.hour < until, *_conditions(where))
    sqlite = session.connection().dialect.name == "sqlite"
    per_hour = _PER_HOUR.get(by) if sqlite else None  # PostgreSQL hashes the groups instead
    if by == "lease" and sqlite:
        stmt = _by_lease_day_first(since, until, window)
    elif per_hour is None:  # grouped at once
        key = _KEYS[by] if by is not None else sa.literal("")
        stmt = sa.select(key, _H.pool, *_SUMS).where(*window).group_by(key, _H.pool)
    else:
        hourly = (
            sa.select(*per_hour, *(sa.func.sum(c).label(c.name) for c in _SECONDS))
            .where(*window)
            .group_by(*per_hour)
            .subquery()
        )
        sums = (sa.func.sum(hourly.c[c.name]) for c in _SECONDS)
        if by is None:
            stmt = sa.select(sa.literal(""), hourly.c.pool, *sums).group_by(hourly.c.pool)
        else:
            key = hourly.c[_KEYS[by].name]
            stmt = sa.select(key, hourly.c.pool, *sums).group_by(key, hourly.c.pool)
    # A breakdown by lease is tens of thousands of lines: each made in one step, no per-row
    # generators or intermediate Usages.
    out: dict[str, Usage] = {}
    for raw, pool, allocated_s, used, busy, idle, unknown, unreserved in (
        session.connection().execute(stmt).all()
    ):
        allocated = float(allocated_s or 0)
        use = Usage(
            allocated,
            float(used or 0),
            float(busy or 0),
            float(idle or 0),
            float(unknown or 0),
            float(unreserved or 0),
            allocated / HOUR * prices.get(pool, 0.0),
        )
        line = _key(by, raw, tz)
        had = out.get(line)
        out[line] = use if had is None else had + use
    return out


#: The UTC day of an hourly row on SQLite (hours are stored as `YYYY-MM-DD HH:MM:SS.ffffff`),
#: spelled exactly as migration 0017's index on it, so that the database reads it from there.
_SQLITE_DAY = sa.func.substr(_H.hour, sa.literal_column("1"), sa.literal_column("10"))


def _by_lease_day_first(since: datetime, until: datetime, window: Sequence[Any]) -> Any:
    """Grouping by lease on SQLite, summed day by day first: SQLite groups by sorting, and
    sorting a month's rows (half a million in a 1,000-GPU lab) by lease was most of the time;
    its index by (UTC day, lease, pool) yields each day's rows already in lease order, so only
    the leases' days are sorted."""
    days = (
        sa.select(_H.lease_id, _H.pool, *(sa.func.sum(c).label(c.name) for c in _SECONDS))
        .where(
            _SQLITE_DAY.between(
                since.astimezone(UTC).date().isoformat(), until.astimezone(UTC).date().isoformat()
            ),
            *window,
        )
        .group_by(_SQLITE_DAY, _H.lease_id, _H.pool)
        .subquery()
    )
    sums = (sa.func.sum(days.c[c.name]) for c in _SECONDS)
    return sa.select(days.c.lease_id, days.c.pool, *sums).group_by(days.c.lease_id, days.c.pool)


def _room_to_group(session: Session) -> None:
    """On PostgreSQL, memory enough for this transaction to hash a window's groups in one
    pass: with the default 4 MB, a month's 42,000 leases spilled to disk in batches."""
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("SET LOCAL work_mem = '64MB'")


def _priced(sums: Sequence[Any], pool: str, prices: Mapping[str, float]) -> Usage:
    """One group's summed seconds, its allocated GPU-hours priced at its pool's price."""
    allocated, used, busy, idle, unknown, unreserved = (float(s or 0) for s in sums)
    cost = allocated / HOUR * prices.get(pool, 0.0)
    return Usage(allocated, used, busy, idle, unknown, unreserved, cost)


#: Breakdowns with few keys per hour: read once grouped by hour, folded into days too.
_FOLDABLE: frozenset[GroupBy | None] = frozenset({None, "team", "pool", "holder", "day"})


def usage_and_days(
    session: Session,
    since: datetime,
    until: datetime,
    where: Filter,
    by: GroupBy | None,
    *,
    prices: Mapping[str, float],
    tz: tzinfo = UTC,
) -> tuple[dict[str, Usage], dict[str, Usage]]:
    """`usage` by `by` and by local day (YYYY-MM-DD in `tz`), from one read grouped by hour,
    which the window index yields in order (a breakdown by lease reads twice instead)."""
    if by not in _FOLDABLE:
        return (
            usage(session, since, until, where, by, prices=prices, tz=tz),
            usage(session, since, until, where, "day", prices=prices, tz=tz),
        )
    _room_to_group(session)
    key = _KEYS[by] if by is not None and by != "day" else sa.literal("")
    stmt = (
        sa.select(_H.hour, key, _H.pool, *_SUMS)
        .where(_H.hour >= since, _H.hour < until, *_conditions(where))
        # In the indexes' order (hour, pool, then team or holder): PostgreSQL then sums as it
        # reads instead of hashing tens of thousands of groups.
        .group_by(_H.hour, _H.pool, key)
    )
    # Summed as plain seconds per (key, pool) and per (hour, pool), unrolled, and priced once
    # per group at the end: a manager's month person by person is tens of thousands of rows,
    # and a Usage made and added per row cost most of the report's time.
    by_key: dict[tuple[Any, str], list[float]] = {}
    by_hour: dict[tuple[Any, str], list[float]] = {}
    for hour, raw, pool, allocated, used, busy, idle, unknown, unreserved in (
        session.connection().execute(stmt).all()
    ):
        for acc, at in ((by_key, (raw, pool)), (by_hour, (hour, pool))):
            had = acc.get(at)
            if had is None:
                acc[at] = [allocated, used, busy, idle, unknown, unreserved]
            else:
                had[0] += allocated
                had[1] += used
                had[2] += busy
                had[3] += idle
                had[4] += unknown
                had[5] += unreserved
    days: dict[tuple[str, str], list[float]] = {}
    for (hour, pool), seconds in by_hour.items():
        _add(days, (_aware(hour).astimezone(tz).date().isoformat(), pool), seconds)
    if by == "day":
        return _fold(days, prices), _fold(days, prices)
    lines: dict[tuple[str, str], list[float]] = {}
    for (raw, pool), seconds in by_key.items():
        _add(lines, (_key(by, raw, tz), pool), seconds)
    return _fold(lines, prices), _fold(days, prices)


def _add(
    sums: dict[tuple[str, str], list[float]], at: tuple[str, str], seconds: list[float]
) -> None:
    had = sums.get(at)
    if had is None:
        sums[at] = list(seconds)
    else:
        for i, s in enumerate(seconds):
            had[i] += s


def _fold(
    sums: Mapping[tuple[str, str], Sequence[float]], prices: Mapping[str, float]
) -> dict[str, Usage]:
    """Seconds summed per (key, pool) as each key's Usage, each pool's part priced."""
    out: dict[str, Usage] = defaultdict(Usage)
    for (key, pool), seconds in sums.items():
        out[key] += _priced(seconds, pool, prices)
    return dict(out)


def _conditions(where: Filter) -> list[Any]:
    return _matching(where, _H.holder, _H.team, _H.pool)


def _matching(where: Filter, holder: Any, team: Any, pool: Any) -> list[Any]:
    """The filter as conditions on a table's holder, team and pool columns."""
    wanted = ((holder, where.holder), (team, where.team), (pool, where.pool))
    return [column == value for column, value in wanted if value is not None]


def _key(by: GroupBy | None, raw: Any, tz: tzinfo) -> str:
    match by:
        case None:
            return ""
        case "lease":
            return f"L{raw}" if raw else ""
        case "day":
            return _aware(raw).astimezone(tz).date().isoformat()
        case "hour":
            return _aware(raw).isoformat()
        case _:
            return str(raw)


def _aware(value: Any) -> datetime:
    """A grouped timestamp as UTC: SQLite hands back text, PostgreSQL an aware datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def waits(session: Session, since: datetime, until: datetime, where: Filter) -> list[float]:
    """Seconds from filing to grant, for borrow requests filed in [since, until) that got a
    lease (at once or after waiting in the queue or for a manager); the database subtracts."""
    stmt = (
        sa.select(_seconds_between(session, col(RequestRow.created_at), col(LeaseRow.granted_at)))
        .select_from(RequestRow)
        .join(LeaseRow, col(LeaseRow.id) == col(RequestRow.lease_id))
        .where(
            col(RequestRow.kind) == "borrow",
            col(RequestRow.created_at) >= since,
            col(RequestRow.created_at) < until,
            *_request_conditions(where),
        )
    )
    rows = session.connection().execute(stmt)
    return [max(0.0, round(float(s or 0), 3)) for (s,) in rows]  # julianday: to the ms


def still_waiting(
    session: Session, since: datetime, until: datetime, where: Filter, *, now: datetime
) -> tuple[int, float | None]:
    """Borrow requests filed in [since, until) still waiting at `now` (for a manager or in the
    queue, no lease yet): how many, and the seconds the oldest has waited (None: none)."""
    stmt = sa.select(sa.func.count(), sa.func.min(col(RequestRow.created_at))).where(
        col(RequestRow.kind) == "borrow",
        col(RequestRow.state).in_([str(RequestState.PENDING), str(RequestState.QUEUED)]),
        col(RequestRow.lease_id).is_(None),
        col(RequestRow.created_at) >= since,
        col(RequestRow.created_at) < until,
        *_request_conditions(where),
    )
    count, oldest = session.connection().execute(stmt).one()
    if not count or oldest is None:
        return 0, None
    return int(count), max(0.0, (now - _aware(oldest)).total_seconds())


def _seconds_between(session: Session, start: Any, end: Any) -> Any:
    if session.connection().dialect.name == "sqlite":
        return (sa.func.julianday(end) - sa.func.julianday(start)) * 86400.0
    return sa.extract("epoch", end - start)


def _request_conditions(where: Filter) -> list[Any]:
    return _matching(where, col(RequestRow.requester), col(RequestRow.team), col(RequestRow.pool))


_COUNTED = {
    AuditTag.SWEEP_RECLAIM: "reclaims",
    AuditTag.LEASE_RECLAIMED: "reclaims",
    AuditTag.LEASE_EXTENDED: "extensions",
    AuditTag.LEASE_RECALLED: "recalls",
}


def counts(session: Session, since: datetime, until: datetime, where: Filter) -> Counts:
    """Reclaims, extensions and recalls of leases in [since, until), from their audit rows;
    a filter joins each row to its lease in SQL (`lease:12` to lease 12), however many."""
    stmt = sa.select(col(AuditRow.tag), col(AuditRow.subject)).where(
        col(AuditRow.tag).in_([str(t) for t in _COUNTED]),
        col(AuditRow.at) >= since,
        col(AuditRow.at) < until,
    )
    if where.holder is not None or where.team is not None or where.pool is not None:
        code = sa.literal("lease:").concat(sa.cast(col(LeaseRow.id), sa.String))
        stmt = stmt.join(LeaseRow, col(AuditRow.subject) == code).where(*_lease_conditions(where))
    tally: dict[str, int] = defaultdict(int)
    reclaimed: set[str] = set()
    for tag, subject in session.connection().execute(stmt).all():
        kind = _COUNTED[AuditTag(tag)]
        if kind == "reclaims":  # the sweep's decision and the lease's end: one reclaim
            reclaimed.add(subject)
        else:
            tally[kind] += 1
    return Counts(len(reclaimed), tally["extensions"], tally["recalls"])


def _lease_conditions(where: Filter) -> list[Any]:
    return _matching(where, col(LeaseRow.holder), col(LeaseRow.team), col(LeaseRow.pool))
