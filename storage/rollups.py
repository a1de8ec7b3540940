"""The hourly usage rows (gpu_hour): rolled up from the per-minute history and the lease
intervals, replaced hour by hour (so rolling an hour again changes nothing), and pruned.

A GPU held by a lease from `granted_at` to its `released_at` (a shrink gave it back) or the
lease's `ended_at` (or the hour's end while it runs) gets one row per lease per hour; a minute
counts for each interval by the seconds of it the interval covers (a lease granted 10:00:50 gets
10 s of that minute). The time no lease held a GPU gets a row (lease_id 0) only when the GPU was
busy then: unreserved use. A minute without a working reading is unknown, never idle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlmodel import Session, col

from rules.domain import LeaseState
from storage import rollup_minutes
from storage.rollup_spans import (
    HOUR,
    Held,
    Minutes,
    aware,
    cut_edges,
)
from storage.tables import (
    GpuHourRow,
    GpuMinuteRow,
    GpuRow,
    LeaseGpuRow,
    LeaseRow,
    NodeRow,
    UtcDateTime,
)

_HOURS = cast(sa.Table, GpuHourRow.__table__)  # type: ignore[attr-defined]
#: Leases that never held a GPU (asked, waiting or refused) have no interval.
_NEVER_HELD = (LeaseState.PENDING, LeaseState.QUEUED, LeaseState.DENIED, LeaseState.CANCELLED)
#: The first key of the advisory locks that let one writer at a time replace an hour (the
#: second is the hour); two-key locks never meet the one-key locks taken elsewhere.
_LOCK_SPACE = 0x67707568  # "gpuh"


def floor_hour(at: datetime) -> datetime:
    """The start of the UTC hour `at` falls in."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hours(since: datetime, until: datetime) -> Iterator[datetime]:
    """Every whole hour starting in [since, until), `since` taken to its hour."""
    hour = floor_hour(since)
    while hour < until:
        yield hour
        hour += HOUR


def fill(session: Session, since_hour: datetime, until_hour: datetime, *, busy_pct: float) -> int:
    """Roll every hour in [since_hour, until_hour) for every GPU, replacing what those hours
    held, in the caller's transaction; returns the rows written. Running it twice changes
    nothing."""
    written = 0
    day = timedelta(days=1)
    start = floor_hour(since_hour)
    while start < until_hour:
        end = min(start + day, until_hour)
        spans = held(session, start, end)
        for hour in hours(start, end):
            rows = hour_rows(session, hour, spans, busy_pct=busy_pct)
            written += replace(session, hour, hour + HOUR, rows)
        start = end
    return written


def held(session: Session, since: datetime, until: datetime) -> list[Held]:
    """Every GPU a lease held at some time in [since, until)."""
    end = sa.func.coalesce(col(LeaseGpuRow.released_at), col(LeaseRow.ended_at))
    stmt = (
        sa.select(
            col(LeaseRow.id),
            col(GpuRow.id),
            col(NodeRow.name),
            col(GpuRow.index),
            col(LeaseRow.pool),
            col(LeaseRow.team),
            col(LeaseRow.holder),
            col(LeaseRow.granted_at),
            col(LeaseGpuRow.released_at),
            col(LeaseRow.ended_at),
        )
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .where(
            col(LeaseRow.state).not_in(_NEVER_HELD),
            col(LeaseRow.granted_at) < until,
            sa.or_(end.is_(None), end > since),
        )
    )
    return [
        Held(
            cast(int, lease),
            cast(int, gpu),
            node,
            index,
            pool,
            team,
            holder,
            start,
            released or ended,
        )
        for lease, gpu, node, index, pool, team, holder, start, released, ended in (
            session.connection().execute(stmt).all()
        )
    ]


def hour_rows(
    session: Session, hour: datetime, spans: Sequence[Held], *, busy_pct: float
) -> list[dict[str, Any]]:
    """The gpu_hour rows of one hour, from the spans that may touch it (`held` over a range
    holding the hour) and the stored minutes of that hour."""
    mine = [s for s in spans if s.seconds_in(hour) > 0]
    minutes, readings = rollup_minutes.summed(session, hour, mine, busy_pct=busy_pct)
    free_busy_s = cut_edges(hour, mine, minutes, readings, busy_pct=busy_pct)
    rows = [_leased(hour, s, minutes.pop((s.node, s.index, s.lease_id), None)) for s in mine]
    for (node, index, lease), m in minutes.items():
        if lease == 0 and m.busy_s > 0:
            free_busy_s[node, index] += m.busy_s
    unheld = {gpu: busy_s for gpu, busy_s in free_busy_s.items() if busy_s >= 0.001}
    if unheld:
        pools = _pools(session)
        for (node, index), busy_s in sorted(unheld.items()):
            if (node, index) in pools:  # a node in no pool is not part of the fleet
                free = minutes.get((node, index, 0))
                peak = free.memory_peak_mib if free is not None else None
                rows.append(
                    _unreserved(
                        hour, node, index, pools[node, index], busy_s=_ms(busy_s), peak_mib=peak
                    )
                )
    return rows


def replace(
    session: Session, since: datetime, until: datetime, rows: Sequence[dict[str, Any]]
) -> int:
    """Put `rows` in place of every row of the hours in [since, until); returns how many."""
    if session.connection().dialect.name == "postgresql":
        # Two writers replacing one hour at once (a leader and the one taking over) would
        # each delete what the other has not committed yet and both insert: the hour counted
        # twice. The second waits for the first, and its delete then sees the first's rows.
        # (SQLite lets one writer at a time in already.)
        for hour in hours(since, until):
            session.execute(
                sa.select(sa.func.pg_advisory_xact_lock(_LOCK_SPACE, int(hour.timestamp()) // 3600))
            )
    session.execute(
        sa.delete(GpuHourRow).where(col(GpuHourRow.hour) >= since, col(GpuHourRow.hour) < until)
    )
    if rows:
        _insert(session, rows)
    return len(rows)


def _insert(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert the rows through the driver, in the session's transaction: one COPY on
    PostgreSQL, one prepared INSERT on SQLite. Every value but the hour is a plain number,
    text or None, which both drivers take as it is; the hour goes in as its column writes it."""
    connection = session.connection()
    dialect = connection.dialect
    quote = dialect.identifier_preparer.quote
    names = [c.name for c in _HOURS.columns if c.name in rows[0]]
    at = names.index("hour")
    written = cast(Any, UtcDateTime().dialect_impl(dialect).bind_processor(dialect))
    hours = {hour: written(hour) if written else hour for hour in {row["hour"] for row in rows}}
    values = [[row[name] for name in names] for row in rows]
    for value in values:
        value[at] = hours[value[at]]
    table, columns = quote(_HOURS.name), ", ".join(quote(name) for name in names)
    cursor = cast(Any, connection.connection.dbapi_connection).cursor()
    if dialect.name == "postgresql":
        with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for value in values:
                copy.write_row(value)
    else:
        marks = ", ".join("?" for _ in names)
        insert = f"INSERT INTO {table} ({columns}) VALUES ({marks})"  # noqa: S608 - the table's own names
        cursor.executemany(insert, values)


def prune(session: Session, before: datetime) -> int:
    """Delete the hourly rows of the hours before `before`; returns how many."""
    result = session.execute(sa.delete(GpuHourRow).where(col(GpuHourRow.hour) < before))
    return int(cast(Any, result).rowcount or 0)


def earliest(session: Session, since: datetime) -> datetime | None:
    """The first moment at or after `since` that the history covers: the oldest stored minute,
    or a lease's grant (or `since` itself for a lease that held GPUs then); None: neither."""
    minute = session.connection().execute(
        sa.select(sa.func.min(col(GpuMinuteRow.minute))).where(col(GpuMinuteRow.minute) >= since)
    )
    granted = session.connection().execute(
        sa.select(sa.func.min(col(LeaseRow.granted_at))).where(
            col(LeaseRow.state).not_in(_NEVER_HELD),
            sa.or_(col(LeaseRow.ended_at).is_(None), col(LeaseRow.ended_at) > since),
        )
    )
    found = [at for at in (minute.scalar(), granted.scalar()) if at is not None]
    if not found:
        return None
    return max(since, min(aware(at) for at in found))


def _ms(seconds: Any) -> float:
    """Seconds to the millisecond (float sums of cut minutes drift below that)."""
    return round(float(seconds or 0.0), 3)


def _pools(session: Session) -> dict[tuple[str, int], str]:
    stmt = sa.select(col(NodeRow.name), col(GpuRow.index), col(GpuRow.pool)).join(
        NodeRow, col(NodeRow.id) == col(GpuRow.node_id)
    )
    return {(node, index): pool for node, index, pool in session.connection().execute(stmt)}


def _leased(hour: datetime, span: Held, minutes: Minutes | None) -> dict[str, Any]:
    allocated = span.seconds_in(hour)
    m = minutes or Minutes(0.0, 0.0, 0.0, None)
    busy, idle = _ms(m.busy_s), _ms(m.observed_s - m.busy_s)
    return {
        "hour": hour,
        "pool": span.pool,
        "node": span.node,
        "index": span.index,
        "team": span.team,
        "holder": span.holder,
        "lease_id": span.lease_id,
        "allocated_s": allocated,
        "used_s": _ms(m.util_pct_s / 100),
        "busy_s": busy,
        "idle_s": idle,
        "unknown_s": max(0.0, _ms(allocated - busy - idle)),
        "unreserved_s": 0.0,
        "memory_peak_mib": m.memory_peak_mib,
    }


def _unreserved(
    hour: datetime, node: str, index: int, pool: str, *, busy_s: float, peak_mib: int | None
) -> dict[str, Any]:
    """Busy minutes no lease held: unreserved use, and nothing else (nothing was allocated, so
    nothing counts as used, busy, idle or unknown)."""
    return {
        "hour": hour,
        "pool": pool,
        "node": node,
        "index": index,
        "team": "",
        "holder": "",
        "lease_id": 0,
        "allocated_s": 0.0,
        "used_s": 0.0,
        "busy_s": 0.0,
        "idle_s": 0.0,
        "unknown_s": 0.0,
        "unreserved_s": busy_s,
        "memory_peak_mib": peak_mib,
    }
