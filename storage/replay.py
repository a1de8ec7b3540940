"""The recorded history a rules simulation replays: the requests made in a window with the
facts they were decided on, the leases that ran in it, and their GPUs' stored minutes.
Callers own the session."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlmodel import Session, col, select

from rules.domain import RequestKind
from rules.minute_trace import MINUTE, Minute
from rules.sweep_replay import LeaseLife
from storage.tables import (
    AuditRow,
    GpuMinuteRow,
    GpuRow,
    LeaseGpuRow,
    LeaseRow,
    NodeRow,
    RequestRow,
    UtcDateTime,
)

_CHUNK = 500  # ids per IN list: well inside every database's limit on bound parameters


@dataclass(frozen=True)
class Recorded:
    """What a simulation shows of a recorded request."""

    id: int
    kind: str
    requester: str
    pool: str
    gpus: int


@dataclass(frozen=True)
class Asked:
    """A request as recorded: what is shown of it, the facts it was decided on (None: its
    audit row is gone or holds none), and how long it waited for a lease (None: it got
    none)."""

    request: Recorded
    facts: Mapping[str, Any] | None
    waited_s: float | None


def requests_in(session: Session, since: datetime, until: datetime) -> list[Asked]:
    """Every borrow and extend request made in [since, until), oldest first."""
    # Only the columns shown, as plain values: whole rows (their JSON lists decoded) took
    # most of the read of a month's tens of thousands of requests.
    requests: sa.Table = RequestRow.__table__  # type: ignore[attr-defined]
    leases: sa.Table = LeaseRow.__table__  # type: ignore[attr-defined]
    request, lease = requests.c, leases.c
    stmt = (
        sa.select(
            request.id,
            request.kind,
            request.requester,
            request.pool,
            request.gpus,
            request.audit_id,
            request.created_at,
            lease.granted_at,
        )
        .join_from(requests, leases, lease.id == request.lease_id, isouter=True)
        .where(
            request.kind.in_([RequestKind.BORROW, RequestKind.EXTEND]),
            request.created_at >= since,
            request.created_at < until,
        )
        .order_by(request.created_at, request.id)
    )
    rows = session.connection().execute(stmt).all()
    facts = _facts(session, [r.audit_id for r in rows if r.audit_id is not None])
    out = []
    for r in rows:
        waited = None
        if r.kind == RequestKind.BORROW and r.granted_at is not None:
            waited = max(0.0, (r.granted_at - r.created_at).total_seconds())
        found = facts.get(r.audit_id) if r.audit_id is not None else None
        shown = Recorded(int(r.id), str(r.kind), r.requester, r.pool, r.gpus)
        out.append(Asked(shown, found or None, waited))
    return out


def _facts(session: Session, ids: list[int]) -> dict[int, Mapping[str, Any]]:
    out: dict[int, Mapping[str, Any]] = {}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        stmt = select(AuditRow.id, AuditRow.facts).where(col(AuditRow.id).in_(chunk))
        out |= {int(i): f for i, f in session.exec(stmt).all() if i is not None}
    return out


def leases_in(session: Session, since: datetime, until: datetime) -> list[LeaseLife]:
    """Every lease that held GPUs at some time in [since, until), by grant, with its GPUs."""
    # Only the columns a lease's life needs, as plain values: a month holds tens of thousands
    # of leases, and whole rows (their warnings and texts) took most of the read.
    lease = LeaseRow.__table__.c  # type: ignore[attr-defined]
    stmt = (
        sa.select(
            lease.id,
            lease.holder,
            lease.team,
            lease.pool,
            lease.gpus,
            lease.priority,
            lease.protected,
            lease.granted_at,
            lease.expires_at,
            lease.ended_at,
        )
        .where(
            lease.granted_at < until,
            sa.or_(lease.ended_at.is_(None), lease.ended_at > since),
        )
        .order_by(lease.granted_at, lease.id)
    )
    rows = session.connection().execute(stmt).all()
    slots = _slots(session, [int(r.id) for r in rows])
    return [
        LeaseLife(
            id=int(r.id),
            holder=r.holder,
            team=r.team,
            pool=r.pool,
            gpus=r.gpus,
            priority=r.priority,
            protected=bool(r.protected),
            granted_at=r.granted_at,
            expires_at=r.expires_at,
            ended_at=r.ended_at,
            slots=tuple(slots.get(int(r.id), ())),
        )
        for r in rows
    ]


def _slots(session: Session, ids: list[int]) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {}
    for start in range(0, len(ids), _CHUNK):
        stmt = (
            select(LeaseGpuRow.lease_id, NodeRow.name, GpuRow.index)
            .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
            .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
            .where(col(LeaseGpuRow.lease_id).in_(ids[start : start + _CHUNK]))
            .order_by(col(LeaseGpuRow.lease_id), col(NodeRow.name), col(GpuRow.index))
        )
        for lease_id, node, index in session.exec(stmt).all():
            out.setdefault(lease_id, []).append((node, index))
    return out


def minute_states(
    session: Session, node: str, since: datetime, until: datetime, *, busy_pct: float
) -> dict[int, bytearray]:
    """Each GPU of `node` (by index) as one `Minute` byte for each minute of [since, until)
    (`since` on a minute): busy when its highest reading reached `busy_pct` (any busy sample
    resets the sweep's idle clock; a minute that kept only its average counts that), idle
    under it, unknown when no working reading was stored.

    The database judges each minute and strings a GPU's minutes together in order, one
    character each, so a GPU's window crosses over as one row; a GPU whose stored minutes
    have gaps is read minute by minute instead."""
    count = max(0, math.ceil((until - since) / MINUTE))
    stmt = _strung(session.get_bind().dialect.name, busy_pct)
    window = {"node": node, "since": since, "until": until}
    out: dict[int, bytearray] = {}
    gaps = []
    for gpu, stored, first, last, text in session.connection().execute(stmt, window).all():
        states = out[gpu] = bytearray(count)
        start = round((_aware(first) - since) / MINUTE)
        end = round((_aware(last) - since) / MINUTE) + 1
        if not (end - start == stored == len(text) and start >= 0 and end <= count):
            gaps.append(gpu)
            continue
        states[start : start + stored] = text.encode().translate(_AS_STATES)
    if not gaps:
        return out
    index, minute = col(GpuMinuteRow.index), col(GpuMinuteRow.minute)
    where = (col(GpuMinuteRow.node) == node, minute >= since, minute < until)
    by_minute = sa.select(index, _minutes_after(session, since), _state(busy_pct))
    for gpu in gaps:
        for _, at, value in session.connection().execute(by_minute.where(*where, index == gpu)):
            if 0 <= at < count:
                out[gpu][at] = value
    return out


@functools.cache
def _strung(dialect: str, busy_pct: float) -> sa.Select[Any]:
    """The statement that strings each GPU's minutes together, built once (a month of a large
    lab asks it for thousands of nodes): the node and the window are bound at each call."""
    index, minute = col(GpuMinuteRow.index), col(GpuMinuteRow.minute)
    where = (
        col(GpuMinuteRow.node) == sa.bindparam("node"),
        minute >= sa.bindparam("since", type_=UtcDateTime()),
        minute < sa.bindparam("until", type_=UtcDateTime()),
    )
    state = _state(busy_pct, as_text=True)
    if dialect == "sqlite":
        # Grouped on the unique index (node, index, minute), so each GPU's minutes are
        # visited, and strung together, in order (SQLite before 3.44 takes no ORDER BY here).
        joined = sa.func.group_concat(state, sa.literal_column("''"))
    else:
        joined = sa.func.string_agg(state, aggregate_order_by(sa.literal(""), minute))
    each = (
        sa.select(index.label("gpu"), sa.func.count().label("stored"), joined.label("text"))
        .where(*where)
        .group_by(index)
        .subquery()
    )
    # Each GPU's first and last stored minute looked up in the index, not kept up along the
    # scan: an aggregate min and max over every row took a third of the read.
    first, last = (
        sa.select(edge(minute)).where(*where, index == each.c.gpu).scalar_subquery()
        for edge in (sa.func.min, sa.func.max)
    )
    return sa.select(each.c.gpu, each.c.stored, first, last, each.c.text)


_AS_STATES = bytes.maketrans(b"012", bytes([Minute.UNKNOWN, Minute.IDLE, Minute.BUSY]))


def _state(busy_pct: float, *, as_text: bool = False) -> sa.ColumnElement[Any]:
    """A stored minute as a `Minute` (or its digit, as text)."""
    util = sa.func.coalesce(col(GpuMinuteRow.util_max_pct), col(GpuMinuteRow.util_avg_pct))

    # Constants written into the statement, not bound: SQLite then works each out once per
    # statement instead of once per row, a quarter of a month's read.
    def value(m: Minute) -> sa.ColumnElement[Any]:
        if as_text:
            return sa.literal_column(f"'{int(m)}'", sa.String)
        return sa.literal_column(str(int(m)), sa.Integer)

    return sa.case(
        (
            sa.or_(col(GpuMinuteRow.ok_samples) <= sa.literal_column("0"), util.is_(None)),
            value(Minute.UNKNOWN),
        ),
        (util >= busy_pct, value(Minute.BUSY)),
        else_=value(Minute.IDLE),
    )


def _aware(at: datetime | str) -> datetime:
    """A minute read back through an aggregate (SQLite hands back its stored text)."""
    when = datetime.fromisoformat(at) if isinstance(at, str) else at
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _minutes_after(session: Session, since: datetime) -> sa.ColumnElement[int]:
    """Whole minutes from `since` to each stored minute, worked out by the database."""
    minute = col(GpuMinuteRow.minute)
    if session.get_bind().dialect.name == "sqlite":  # stored as text: "YYYY-MM-DD HH:MM:SS..."
        start = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        days = sa.func.julianday(minute) - sa.func.julianday(sa.literal(start))
        return sa.cast(sa.func.round(days * 1440), sa.Integer)
    seconds = sa.extract("epoch", minute - sa.bindparam("since", since, type_=UtcDateTime()))
    return sa.cast(sa.func.floor(seconds / 60 + 0.5), sa.Integer)
