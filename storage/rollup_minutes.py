"""An hour's stored minutes summed per GPU and per lease holding any of each (0: none did),
for the hourly rollup; and the readings of the minutes at the leases' ends, which
`rollup_spans.cut_edges` cuts.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Session, col

from storage.rollup_spans import HOUR, MINUTE, MINUTE_S, Held, Minutes, Reading, floor_minute
from storage.tables import GpuMinuteRow, GpuRow, NodeRow, UtcDateTime

#: GPU ids bound in one statement at most (SQLite takes at most 32,766 bound values).
_MAX_IDS = 30_000


def summed(
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
