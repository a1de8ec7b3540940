"""The hourly usage rows (gpu_hour): rolled up from the per-minute history and the lease
intervals, replaced hour by hour (so rolling an hour again changes nothing), and pruned.

A GPU held by a lease from `granted_at` to its `released_at` (a shrink gave it back) or the
lease's `ended_at` (or the hour's end while it runs) gets one row per lease per hour; a minute
counts for each interval by the seconds of it the interval covers (a lease granted 10:00:50 gets
10 s of that minute). The time no lease held a GPU gets a row (lease_id 0) only when the GPU was
busy then: unreserved use. A minute without a working reading is unknown, never idle.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Session, col

from rules.domain import LeaseState
from storage.rollup_spans import (
    HOUR,
    MINUTE,
    MINUTE_S,
    Held,
    Minutes,
    Reading,
    aware,
    cut_edges,
    floor_minute,
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
#: GPU ids bound in one statement at most (SQLite takes at most 32,766 bound values).
_MAX_IDS = 30_000
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
    minutes, readings = _minutes(session, hour, mine, busy_pct=busy_pct)
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


def _minutes(
    session: Session, hour: datetime, spans: Sequence[Held], *, busy_pct: float
) -> tuple[dict[tuple[str, int, int], Minutes], dict[tuple[str, int, datetime], Reading]]:
    """The hour's minutes summed per GPU and per lease holding any of each then (0: none did),
    every minute counted whole; `cut_edges` takes off what the intervals' ends did not hold.
    Also the readings of the minutes at the intervals' ends, which `cut_edges` reads.

    A GPU one lease held all hour, or none did, has all its minutes under one key: the
    database sums them per GPU. The others (a lease began or ended in the hour, or two held
    the GPU) are few: the database sums their stretches of minutes the same leases held, and
    those sums are added up here for each lease holding them.
    """
    by_gpu: defaultdict[int, list[Held]] = defaultdict(list)
    for span in spans:
        by_gpu[span.gpu_id].append(span)
    whole = {
        (held[0].node, held[0].index): held[0].lease_id
        for held in by_gpu.values()
        if _holds_all(held, hour)
    }
    split = {
        gpu: held for gpu, held in by_gpu.items() if (held[0].node, held[0].index) not in whole
    }
    sums: dict[tuple[str, int, int], Minutes] = {}
    for node, index, summed in _whole_hours(session, hour, split, busy_pct=busy_pct):
        sums[node, index, whole.get((node, index), 0)] = summed
    shared, readings = _split_hours(session, hour, split, busy_pct=busy_pct)
    sums.update(shared)
    return sums, readings


def _holds_all(held: Sequence[Held], hour: datetime) -> bool:
    return len(held) == 1 and held[0].holds_all(hour)


def _in_hour(hour: datetime) -> sa.ColumnElement[bool]:
    m = GpuMinuteRow
    return sa.and_(col(m.minute) >= hour, col(m.minute) < hour + HOUR)


def _sums(busy_pct: float) -> tuple[sa.ColumnElement[Any], ...]:
    """What a set of minutes adds up to: minutes stored, observed (a working reading), busy,
    utilisation summed over the observed ones (None: none), memory peak."""
    m = GpuMinuteRow
    util = sa.case((col(m.ok_samples) > 0, col(m.util_avg_pct)))  # NULL: no working reading
    return (
        sa.func.count(col(m.minute)),
        sa.func.count(util),
        sa.func.count(sa.case((util >= busy_pct, 1))),
        sa.func.sum(util),
        sa.func.max(col(m.memory_used_max_mib)),
    )


def _whole_hours(
    session: Session, hour: datetime, split: dict[int, list[Held]], *, busy_pct: float
) -> Iterator[tuple[str, int, Minutes]]:
    """Each GPU's minutes of the hour summed, but for the GPUs in `split` and those with none
    stored: (node, index, sums)."""
    m = GpuMinuteRow
    if session.connection().dialect.name == "postgresql":
        # PostgreSQL hashes the groups: the hour's minutes as they lie, no join. (A GPU in
        # no pool's list comes out too, and counts for nothing: `hour_rows` leaves it out.)
        grouped = (
            sa.select(col(m.node), col(m.index), *_sums(busy_pct))
            .where(_in_hour(hour))
            .group_by(col(m.node), col(m.index))
        )
    else:
        # SQLite groups by sorting: walking the GPUs in order instead, and reading each one's
        # minutes from the (node, index, minute) index, it needs no sort (the outer join keeps
        # that order), and it reads no minute of a GPU outside the fleet.
        grouped = (
            sa.select(col(NodeRow.name), col(GpuRow.index), *_sums(busy_pct))
            .select_from(GpuRow)
            .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
            .outerjoin(
                m,
                sa.and_(
                    col(m.node) == col(NodeRow.name),
                    col(m.index) == col(GpuRow.index),
                    _in_hour(hour),
                ),
            )
            .group_by(col(GpuRow.id), col(NodeRow.name), col(GpuRow.index))
        )
        if len(split) <= _MAX_IDS:
            grouped = grouped.where(col(GpuRow.id).not_in(sorted(split)))
    leave_out = {(held[0].node, held[0].index) for held in split.values()}
    for node, index, stored, seen, worked, util, peak in session.connection().execute(grouped):
        if stored and (node, index) not in leave_out:
            yield (
                node,
                index,
                Minutes(
                    int(seen) * MINUTE_S,
                    int(worked) * MINUTE_S,
                    float(util or 0.0) * MINUTE_S,
                    peak,
                ),
            )


def _split_hours(
    session: Session, hour: datetime, split: dict[int, list[Held]], *, busy_pct: float
) -> tuple[dict[tuple[str, int, int], Minutes], dict[tuple[str, int, datetime], Reading]]:
    """The hour's minutes of the GPUs held for part of it, each counted whole for every
    interval holding any of it (0: none did); and the readings of the minutes at the
    intervals' ends. The database sums the stretches of minutes the same leases held, and
    each of those end minutes alone."""
    pieces = [
        (gpu_id, since, until, owners)
        for gpu_id, held in split.items()
        for since, until, owners in stretches(hour, held)
    ]
    sums: dict[tuple[int, int], tuple[int, int, float, int | None]] = {}
    readings: dict[tuple[str, int, datetime], Reading] = {}
    if not pieces:
        return {}, readings
    for k, stored, seen, worked, util, peak in _piece_sums(session, pieces, busy_pct=busy_pct):
        gpu_id, since, until, owners = pieces[k]
        if not stored:
            continue
        if until - since == MINUTE:  # a minute alone: its reading
            gpu = split[gpu_id][0]
            readings[gpu.node, gpu.index, since] = (seen, util if seen else None)
        for lease in owners:
            had_seen, had_busy, total, top = sums.get((gpu_id, lease), (0, 0, 0.0, None))
            if peak is not None and (top is None or peak > top):
                top = peak
            sums[gpu_id, lease] = (had_seen + seen, had_busy + worked, total + util, top)
    return {
        (split[gpu_id][0].node, split[gpu_id][0].index, lease): Minutes(
            seen * MINUTE_S, busy * MINUTE_S, total * MINUTE_S, top
        )
        for (gpu_id, lease), (seen, busy, total, top) in sums.items()
    }, readings


def stretches(
    hour: datetime, held: Sequence[Held]
) -> list[tuple[datetime, datetime, tuple[int, ...]]]:
    """The hour cut where the leases holding the GPU change (a minute counts whole for each
    interval holding any of it), and around each minute an interval holds only part of:
    (from, until, the leases holding those minutes, (0,): none)."""
    end = hour + HOUR
    cuts = {hour, end}
    for span in held:
        cuts.add(floor_minute(span.start))
        if span.end is not None:
            last = floor_minute(span.end)
            cuts.add(last if last == span.end else last + MINUTE)
        for at in {floor_minute(span.start), floor_minute(span.end or span.start)}:
            cuts.update((at, at + MINUTE))
    ordered = sorted(at for at in cuts if hour <= at <= end)
    return [
        (since, until, tuple(s.lease_id for s in held if s.holds_minute(since)) or (0,))
        for since, until in itertools.pairwise(ordered)
    ]


def _piece_sums(
    session: Session,
    pieces: Sequence[tuple[int, datetime, datetime, tuple[int, ...]]],
    *,
    busy_pct: float,
) -> list[tuple[int, int, int, int, float, int | None]]:
    """Each piece's minutes summed: (its place in `pieces`, minutes stored, observed, busy,
    utilisation summed, memory peak)."""
    m = GpuMinuteRow
    p = _piece_table(session, pieces)
    stmt = (
        sa.select(p.c.k, *_sums(busy_pct))
        .select_from(p)
        .join(GpuRow, col(GpuRow.id) == p.c.gpu_id)
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .outerjoin(  # outer, as in _whole_hours: each piece's minutes from their index
            m,
            sa.and_(
                col(m.node) == col(NodeRow.name),
                col(m.index) == col(GpuRow.index),
                col(m.minute) >= p.c.since,
                col(m.minute) < p.c.until,
            ),
        )
        .group_by(p.c.k)
        .order_by(p.c.k)  # each lease's sums added up in the order of its minutes
    )
    return [
        (int(k), int(stored), int(seen or 0), int(worked or 0), float(util or 0.0), peak)
        for k, stored, seen, worked, util, peak in session.connection().execute(stmt).all()
    ]


def _piece_table(
    session: Session, pieces: Sequence[tuple[int, datetime, datetime, tuple[int, ...]]]
) -> sa.FromClause:
    """The pieces as a table (k, gpu_id, since, until), sent as one JSON text: thousands of
    rows of bound values would cost more to compile than the sums cost to read."""
    dialect = session.connection().dialect
    if dialect.name == "sqlite":
        # the text the stored minutes are, which SQLite compares them with
        text = cast(Any, UtcDateTime().dialect_impl(dialect).bind_processor(dialect))
        data = json.dumps(
            [
                {"k": k, "gpu_id": gpu_id, "since": text(since), "until": text(until)}
                for k, (gpu_id, since, until, _) in enumerate(pieces)
            ]
        )
        each = sa.func.json_each(data).table_valued("value")
        return (
            sa.select(
                *(
                    sa.func.json_extract(each.c.value, f"$.{name}").label(name)
                    for name in ("k", "gpu_id", "since", "until")
                )
            )
            .select_from(each)
            .cte("piece")
            .prefix_with("MATERIALIZED")
        )
    records = [
        {"k": k, "gpu_id": gpu_id, "since": since.isoformat(), "until": until.isoformat()}
        for k, (gpu_id, since, until, _) in enumerate(pieces)
    ]
    return (
        sa.func.jsonb_to_recordset(sa.bindparam("pieces", records, type_=JSONB))
        .table_valued(
            sa.column("k", sa.Integer()),
            sa.column("gpu_id", sa.Integer()),
            sa.column("since", sa.DateTime(timezone=True)),
            sa.column("until", sa.DateTime(timezone=True)),
        )
        .render_derived(name="piece", with_types=True)
    )


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
