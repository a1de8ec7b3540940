"""Leases: what the active leases hold, per team and per GPU, read and locked for the use cases
and the sweep. Callers own the session (and so the transaction).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection
from sqlmodel import Session, col, select, update

from rules.domain import GpuState, LeaseState, Priority
from rules.fairshare import Interval
from rules.lease_facts import GpuLine, LeaseSnapshot, Warned
from rules.marks import RECALL, Marks
from storage import outbox
from storage.db import lock_for_update
from storage.decay import decayed_use_sqlite
from storage.sweep_reads import Between, chunked, fetched
from storage.tables import RECALLED_WHERE, GpuRow, LeaseGpuRow, LeaseRow, NodeRow, OutboxRow

#: A lease GPU held now, written as ix_lease_gpu_active's own condition (`WHERE active`):
#: SQLite uses a partial index only for a query that repeats its condition, and SQLAlchemy
#: writes a boolean column as `active = 1` or `active IS 1` there, which it does not match.
HELD: sa.ColumnClause[bool] = sa.literal_column(f"{LeaseGpuRow.__tablename__}.active")


def flushed(session: Session) -> Connection:
    """The session's connection for a read of plain rows, with the changes pending in the
    session written first, as an ORM query would (autoflush) before reading."""
    if session.new or session.dirty or session.deleted:
        session.flush()
    return session.connection()


def get(session: Session, lease_id: int) -> LeaseRow | None:
    """The lease (None: there is no such lease)."""
    return session.get(LeaseRow, lease_id)


def listed(
    session: Session, *, active_only: bool = True, holder: str | None = None
) -> list[LeaseRow]:
    """Leases, newest first; by default only the active ones."""
    stmt = select(LeaseRow).order_by(col(LeaseRow.id).desc())
    if holder is not None:
        stmt = stmt.where(LeaseRow.holder == holder)
    if active_only:
        stmt = stmt.where(_active(by_holder=holder is not None))
    return list(session.exec(stmt).all())


def _active(*, by_holder: bool) -> sa.ColumnElement[bool]:
    """The lease is active. Asked of one person's leases, written so that no index can serve
    it: without statistics SQLite would read every active lease of the fleet through the
    state index to find a person's few, rather than their leases through the holder's."""
    state = col(LeaseRow.state) + "" if by_holder else col(LeaseRow.state)
    return state == LeaseState.ACTIVE


def by_id(session: Session, lease_ids: Iterable[int]) -> dict[int, LeaseRow]:
    """The leases with these ids, in as few reads as the bind limits allow (a plan may change
    hundreds of leases: one `get` each would be a read each)."""
    ids = sorted(set(lease_ids))
    found: dict[int, LeaseRow] = {}
    for k in range(0, len(ids), _IN_CHUNK):
        stmt = select(LeaseRow).where(col(LeaseRow.id).in_(ids[k : k + _IN_CHUNK]))
        found.update((row.id or 0, row) for row in session.exec(stmt))
    return found


def in_pool_active_or_preempted(session: Session, pool: str) -> list[LeaseRow]:
    """The pool's leases that are active or ended preempted (those a recall may have chosen)."""
    stmt = select(LeaseRow).where(
        LeaseRow.pool == pool,
        sa.or_(col(LeaseRow.state) == LeaseState.ACTIVE, col(LeaseRow.end_reason) == "preempted"),
    )
    return list(session.exec(stmt).all())


def recalled_for(session: Session, pool: str, request_id: int, since: datetime) -> list[int]:
    """The pool's leases whose recall serves request `request_id`: active ones, and those
    preempted since `since` (when the request was made: none before it could be for it), by
    id. Two indexed reads, not the pool's history."""
    marks: Any = sa.type_coerce(col(LeaseRow.warnings), sa.JSON)
    serves = marks[(RECALL, "request")].as_integer() == request_id
    active = sa.select(col(LeaseRow.id)).where(
        col(LeaseRow.pool) == pool, _being_recalled(session), serves
    )
    preempted = sa.select(col(LeaseRow.id)).where(
        col(LeaseRow.end_reason) == "preempted",
        col(LeaseRow.ended_at) >= since,
        col(LeaseRow.pool) == pool,
        serves,
    )
    db = flushed(session)
    return sorted({i or 0 for stmt in (active, preempted) for (i,) in db.execute(stmt)})


def held_since(session: Session, pool: str, since: datetime) -> list[Interval]:
    """The pool's leases held at any time since `since`: each team's GPUs from the grant to
    the end (None while the lease is active), oldest grant first."""
    stmt = (
        sa.select(
            col(LeaseRow.team), col(LeaseRow.gpus), col(LeaseRow.granted_at), col(LeaseRow.ended_at)
        )
        .where(
            col(LeaseRow.pool) == pool,
            sa.or_(
                col(LeaseRow.state) == LeaseState.ACTIVE,
                col(LeaseRow.ended_at) >= since,
            ),
        )
        .order_by(col(LeaseRow.granted_at), col(LeaseRow.id))
    )
    # plain rows (fair share reads thousands of them); an active lease has no ended_at yet
    rows = flushed(session).execute(stmt).all()
    return [Interval(team, gpus, start, end) for team, gpus, start, end in rows]


def decayed_use(
    session: Session, pool: str, since: datetime, now: datetime, rate_per_hour: float
) -> dict[str, float]:
    """What `rules.fairshare.decayed_usage` makes of `held_since(session, pool, since)`: each
    lease's term (its GPUs times the integral of 2 ** (-age / half-life) over its time held,
    clipped at `now`; `rate_per_hour` is ln 2 over the half-life in hours) with ages in whole
    microseconds divided as Python divides two timedeltas, added per team in the same order.
    Teams with no such lease are left out. On SQLite, to the bit: `storage.decay` reads the
    leases as one list of numbers and times per team (turning each stored text into
    microseconds cost SQLite more than all the rest) and computes the terms in Python. On
    PostgreSQL the database computes each term, to the last bit where its exp() is Python's,
    and they are added here, so no timestamp is converted in Python."""
    if session.get_bind().dialect.name == "sqlite":
        return decayed_use_sqlite(session, pool, since, now, rate_per_hour)
    here = col(LeaseRow.pool) == pool
    held: tuple[sa.Label[Any], ...] = (
        col(LeaseRow.id).label("id"),
        col(LeaseRow.team).label("team"),
        col(LeaseRow.gpus).label("gpus"),
        _micros(col(LeaseRow.granted_at)).label("granted"),
        _micros(col(LeaseRow.ended_at)).label("ended"),
    )
    # Two seeks of ix_lease_pool_state_ended: the pool's active leases, and those of every
    # other state that ended since `since` (the same leases as `held_since`, none twice).
    others = [state.value for state in LeaseState if state != LeaseState.ACTIVE]
    leases = sa.union_all(
        sa.select(*held).where(here, col(LeaseRow.state) == LeaseState.ACTIVE),
        sa.select(*held).where(
            here, col(LeaseRow.state).in_(others), col(LeaseRow.ended_at) >= since
        ),
    ).subquery()
    at = sa.literal((now - _EPOCH) // _MICROSECOND, sa.BigInteger)
    end = sa.case((sa.or_(leases.c.ended.is_(None), leases.c.ended > at), at), else_=leases.c.ended)
    start = sa.case((leases.c.granted > end, end), else_=leases.c.granted)
    per_hour = sa.literal(3_600_000_000.0, sa.Float)
    older = sa.cast(at - start, sa.Float) / per_hour  # hours since the lease began
    newer = sa.cast(at - end, sa.Float) / per_hour  # hours since it ended (0: it runs on)
    fall = sa.literal(-rate_per_hour, sa.Float)
    hours = (_exp(fall * newer) - _exp(fall * older)) / sa.literal(rate_per_hour, sa.Float)
    # in `held_since`'s order, which `decayed_usage` adds them in
    stmt = sa.select(leases.c.team, leases.c.gpus * hours).order_by(leases.c.granted, leases.c.id)
    usage: dict[str, float] = {}
    for team, term in flushed(session).execute(stmt).all():
        usage[team] = usage.get(team, 0.0) + term
    return usage


def _exp(power: Any) -> Any:
    """exp() of a power no lower than -700: PostgreSQL raises on an underflow (a lease a
    thousand half-lives old) where Python gives 0. The terms differ by under 1e-304, which a
    lease of the window (ended within a few half-lives: exp() at least 1/64 beside it) absorbs
    exactly."""
    return sa.func.exp(sa.func.greatest(power, sa.literal(-700.0, sa.Float)))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(value: Any) -> Any:
    """A stored timestamp as whole microseconds since the epoch (an integer: exact)."""
    return sa.cast(sa.func.extract("epoch", value) * 1_000_000, sa.BigInteger)


def lock_gpus(session: Session, gpu_ids: Iterable[int] | sa.Select[Any]) -> None:
    """On PostgreSQL, lock these GPUs' rows in id order before a change that writes several of
    them: the `held` triggers write a GPU row whenever a lease takes or lets go of it, and the
    device observer writes hundreds at a time, so every writer of several GPU rows takes them
    in one order and no two of them wait on each other in a cycle (a deadlock would fail a
    release or a poll). SQLite writers are already serial."""
    if session.get_bind().dialect.name != "postgresql":
        return
    ids = gpu_ids if isinstance(gpu_ids, sa.Select) else sorted(set(gpu_ids))
    if isinstance(ids, list) and not ids:
        return
    stmt = sa.select(col(GpuRow.id)).where(col(GpuRow.id).in_(ids)).order_by(col(GpuRow.id))
    # FOR NO KEY UPDATE: what an UPDATE of non-key columns takes; foreign keys still share
    session.connection().execute(stmt.with_for_update(key_share=True))


def let_go(session: Session, lease_id: int | None) -> None:
    """The lease's GPUs are no longer held (its ledger rows stay, inactive)."""
    held = sa.select(col(LeaseGpuRow.gpu_id)).where(
        col(LeaseGpuRow.lease_id) == lease_id, col(LeaseGpuRow.active)
    )
    lock_gpus(session, held)  # in the one statement, on PostgreSQL only
    session.exec(
        update(LeaseGpuRow).where(col(LeaseGpuRow.lease_id) == lease_id).values(active=False)
    )


def held_by_team(session: Session, pool: str) -> dict[str, int]:
    """GPUs held per team in active leases of one pool."""
    rows = session.exec(
        select(LeaseRow.team, sa.func.sum(LeaseRow.gpus))
        .where(LeaseRow.pool == pool, LeaseRow.state == LeaseState.ACTIVE)
        .group_by(col(LeaseRow.team))
    ).all()
    return {str(team): int(n) for team, n in rows}


def held_gpus(session: Session) -> dict[int, tuple[int, str, datetime]]:
    """{gpu id: (lease id, holder, granted at)} over active leases."""
    rows = session.exec(
        select(LeaseGpuRow.gpu_id, LeaseRow.id, LeaseRow.holder, LeaseRow.granted_at)
        .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
        .where(HELD)
    ).all()
    return {gpu_id: (int(lease_id or 0), holder, at) for gpu_id, lease_id, holder, at in rows}


def active_in(session: Session, pool: str) -> list[LeaseRow]:
    """The active leases of one pool, by id."""
    stmt = (
        select(LeaseRow)
        .where(LeaseRow.pool == pool, LeaseRow.state == LeaseState.ACTIVE)
        .order_by(col(LeaseRow.id))
    )
    return list(session.exec(stmt).all())


def _being_recalled(session: Session) -> sa.TextClause:
    """The lease is active and carries a recall (`Marks.recalled`), written as the condition
    of ix_lease_recalled itself: each database uses a partial index only for a query that
    repeats its condition, and the recalls under way are a few leases of a pool's thousands."""
    return sa.text(RECALLED_WHERE[session.get_bind().dialect.name])


def any_recalled(session: Session, pool: str) -> bool:
    """Is any active lease of the pool being recalled?"""
    stmt = sa.select(col(LeaseRow.id)).where(col(LeaseRow.pool) == pool, _being_recalled(session))
    return flushed(session).execute(stmt.limit(1)).first() is not None


@dataclass(frozen=True)
class PoolLease:
    """An active lease of a pool as the queue and recall weigh it: plain columns, its GPUs
    that would come back free (healthy, on an undrained node), and its marks when it is being
    recalled (empty otherwise: only a recall's marks are read here)."""

    id: int
    holder: str
    team: str
    gpus: int
    priority: str
    protected: bool
    granted_at: datetime
    expires_at: datetime
    usable: int
    marks: Marks


def pool_leases(
    session: Session,
    pool: str,
    *,
    teams: Collection[str] | None = None,
    ids: Collection[int] = (),
    ending: tuple[datetime, datetime] | None = None,
) -> list[PoolLease]:
    """The pool's active leases, by id, in two reads of plain columns: no ORM objects, the
    timestamps converted here (`_utc`), and the stored marks decoded only for the leases being
    recalled. With `teams`, only those teams' leases, those in `ids`, the leases being
    recalled, and (with `ending`, `(after, until)`) those that expire after `after` and by
    `until`: recall's plan touches a few hundred of a large pool's thousands."""
    here = (col(LeaseRow.pool) == pool, col(LeaseRow.state) == LeaseState.ACTIVE)
    db = flushed(session)
    recalled = _recall_marks(session, pool)
    some: list[sa.ColumnElement[bool]] = []
    if teams is not None:
        alternatives: list[sa.ColumnElement[bool]] = []
        if teams:
            alternatives.append(col(LeaseRow.team).in_(sorted(teams)))
        if some_ids := sorted({*ids, *(i for i in recalled if i is not None)}):
            alternatives.append(_among(db, col(LeaseRow.id), some_ids))
        if ending is not None:
            after, until = ending
            expiring = (col(LeaseRow.expires_at) > after, col(LeaseRow.expires_at) <= until)
            alternatives.append(sa.and_(*expiring))
        if not alternatives:
            return []
        some.append(sa.or_(*alternatives))
    rows = db.execute(
        sa.select(
            col(LeaseRow.id),
            col(LeaseRow.holder),
            col(LeaseRow.team),
            col(LeaseRow.gpus),
            col(LeaseRow.priority),
            col(LeaseRow.protected),
            _plain(col(LeaseRow.granted_at), sa.String),
            _plain(col(LeaseRow.expires_at), sa.String),
            _usable(),
        )
        .where(*here, *some)
        .order_by(col(LeaseRow.id))
    ).all()
    return [
        PoolLease(
            lease_id,
            holder,
            team,
            gpus,
            priority,
            protected,
            _utc(granted_at),
            _utc(expires_at),
            int(usable_gpus or 0),
            recalled.get(lease_id, Marks()),
        )
        for (
            lease_id,
            holder,
            team,
            gpus,
            priority,
            protected,
            granted_at,
            expires_at,
            usable_gpus,
        ) in rows
    ]


def borrowing(session: Session, pool: str, team: str, beyond: int) -> list[int]:
    """The ids of `team`'s active leases in `pool` that hold its `beyond` GPUs beyond its
    nominal (rules.recall.borrowed_parts): its leases from the lowest priority, the most
    recently granted first among equals, until their GPUs reach `beyond`."""
    if beyond <= 0:
        return []
    ranked = sa.case(
        {p.value: p.rank for p in Priority},
        value=col(LeaseRow.priority),
        else_=Priority.NORMAL.rank,
    )
    stmt = (
        sa.select(col(LeaseRow.id), col(LeaseRow.gpus))
        .where(
            col(LeaseRow.pool) == pool,
            col(LeaseRow.state) == LeaseState.ACTIVE,
            col(LeaseRow.team) == team,
        )
        .order_by(ranked, col(LeaseRow.granted_at).desc(), col(LeaseRow.id).desc())
    )
    out: list[int] = []
    for lease_id, gpus in flushed(session).execute(stmt).all():
        if beyond <= 0:
            break
        out.append(int(lease_id or 0))
        beyond -= gpus
    return out


def ends_by_expiry(
    session: Session,
    pool: str,
    *,
    upto: int,
    besides: Collection[int] = (),
    after: tuple[datetime, int] | None = None,
    limit: int,
) -> list[tuple[int, datetime, int]]:
    """Of the pool's active leases with ids up to `upto` (those of a moment: a lease granted
    since has a higher id) and not in `besides`, the first `limit` in order of expiry, then
    id, after `after` (an expiry and an id, where the last read stopped: a lease ended in the
    meantime moves none of the others): each one's usable GPUs (`_usable`), its expiry and its
    id. Read from ix_lease_pool_state_expires, as far as the queue's timeline needs them."""
    expires, lease = col(LeaseRow.expires_at), col(LeaseRow.id)
    stmt = (
        sa.select(_plain(expires, sa.String), _usable(), lease)
        .where(col(LeaseRow.pool) == pool, col(LeaseRow.state) == LeaseState.ACTIVE, lease <= upto)
        .order_by(expires, lease)
        .limit(limit)
    )
    if after is not None:
        at, last = after
        stmt = stmt.where(expires >= at, sa.or_(expires > at, lease > last))
    db = flushed(session)
    if besides:
        stmt = stmt.where(sa.not_(_among(db, lease, sorted(besides))))
    rows = db.execute(stmt).all()
    return [(int(usable or 0), _utc(at), int(i or 0)) for at, usable, i in rows]


def last_id(session: Session) -> int:
    """The highest lease id given so far (0: none)."""
    return int(flushed(session).execute(sa.select(sa.func.max(col(LeaseRow.id)))).scalar() or 0)


def _recall_marks(session: Session, pool: str) -> dict[int | None, Marks]:
    """The marks of the pool's leases being recalled, by lease id."""
    marked = sa.select(col(LeaseRow.id), col(LeaseRow.warnings)).where(
        col(LeaseRow.pool) == pool, _being_recalled(session)
    )
    return {row[0]: row[1] for row in flushed(session).execute(marked)}


def _usable() -> sa.ScalarSelect[Any]:
    """A lease's GPUs that would come back free: held, healthy, on an undrained node."""
    return (
        sa.select(sa.func.count())
        .select_from(LeaseGpuRow)
        .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .where(
            col(LeaseGpuRow.lease_id) == col(LeaseRow.id),
            HELD,
            col(GpuRow.state) == GpuState.OK,
            sa.not_(col(NodeRow.drained)),
        )
        .scalar_subquery()
    )


def last_preempted_since(session: Session, since: datetime) -> dict[str, datetime]:
    """The holders of leases preempted since `since`, each with their latest preemption."""
    stmt = (
        select(LeaseRow.holder, sa.func.max(LeaseRow.ended_at))
        .where(LeaseRow.end_reason == "preempted", col(LeaseRow.ended_at) >= since)
        .group_by(col(LeaseRow.holder))
    )
    return {holder: at for holder, at in session.exec(stmt).all() if at is not None}


def usable_gpus(session: Session, lease_ids: list[int]) -> dict[int, int]:
    """Per lease, its GPUs that would come back free: healthy, on an undrained node."""
    if not lease_ids:
        return {}
    rows = session.exec(
        select(LeaseGpuRow.lease_id, sa.func.count())
        .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .where(
            col(LeaseGpuRow.lease_id).in_(lease_ids),
            HELD,
            GpuRow.state == GpuState.OK,
            col(NodeRow.drained).is_(False),
        )
        .group_by(col(LeaseGpuRow.lease_id))
    ).all()
    return {int(lease_id): int(n) for lease_id, n in rows}


def active_teams(session: Session) -> dict[int, str]:
    """The team holding each active lease: {lease id: team}."""
    stmt = select(LeaseRow.id, LeaseRow.team).where(LeaseRow.state == LeaseState.ACTIVE)
    return {lease_id: team for lease_id, team in session.exec(stmt).all() if lease_id}


def lock_active_of(session: Session, holder: str) -> list[LeaseRow]:
    """The holder's active leases, locked for a change."""
    stmt = select(LeaseRow).where(LeaseRow.holder == holder, _active(by_holder=True))
    return list(session.exec(lock_for_update(session, stmt)).all())


def reclaimed_from(session: Session, gpu_id: int, since: datetime) -> set[str]:
    """The holders of leases on this GPU reclaimed since `since` (holding it then: not one it
    gave back before)."""
    stmt = (
        select(LeaseRow.holder)
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .where(
            LeaseGpuRow.gpu_id == gpu_id,
            col(LeaseGpuRow.released_at).is_(None),
            LeaseRow.state == LeaseState.RECLAIMED,
            col(LeaseRow.ended_at) >= since,
        )
    )
    return set(session.exec(stmt).all())


def gave_back(session: Session, gpu_id: int) -> set[str]:
    """The holders of active leases that gave this GPU back (a shrink) and run on without it."""
    stmt = (
        select(LeaseRow.holder)
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .where(
            LeaseGpuRow.gpu_id == gpu_id,
            col(LeaseGpuRow.active).is_(False),
            LeaseRow.state == LeaseState.ACTIVE,
        )
    )
    return set(session.exec(stmt).all())


def slots_of(session: Session, lease_id: int) -> list[tuple[str, int]]:
    """The (node, index) of every GPU a lease holds, or held at its end once it ended (GPUs a
    shrink gave back are no longer its own, then or later)."""
    rows = session.exec(
        select(NodeRow.name, GpuRow.index, LeaseGpuRow.active, LeaseGpuRow.released_at)
        .join(GpuRow, col(GpuRow.node_id) == col(NodeRow.id))
        .join(LeaseGpuRow, col(LeaseGpuRow.gpu_id) == col(GpuRow.id))
        .where(LeaseGpuRow.lease_id == lease_id)
    ).all()
    held = [(node, index) for node, index, active, _ in rows if active]
    return held or [(node, index) for node, index, _, released in rows if released is None]


def slots_of_each(session: Session, lease_ids: list[int]) -> dict[int, list[tuple[str, int]]]:
    """`slots_of` for many leases at once: one read per few thousand leases, not one each."""
    rows: dict[int, list[tuple[str, int, bool, datetime | None]]] = {}
    for i in range(0, len(lease_ids), _IN_CHUNK):
        for lease_id, node, index, active, released in flushed(session).execute(
            sa.select(
                col(LeaseGpuRow.lease_id),
                col(NodeRow.name),
                col(GpuRow.index),
                col(LeaseGpuRow.active),
                col(LeaseGpuRow.released_at),
            )
            .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
            .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
            .where(col(LeaseGpuRow.lease_id).in_(lease_ids[i : i + _IN_CHUNK]))
        ):
            rows.setdefault(lease_id, []).append((node, index, active, released))
    out = {}
    for lease_id, gpus in rows.items():
        held = [(node, index) for node, index, active, _ in gpus if active]
        out[lease_id] = held or [(node, index) for node, index, _, gone in gpus if gone is None]
    return out


def held_seen(session: Session, lease_id: int) -> list[tuple[str, int, str]]:
    """The GPUs a lease holds now, each with what telemetry last showed on it
    (`rules.domain.Observed`)."""
    rows = session.exec(
        select(NodeRow.name, GpuRow.index, GpuRow.observed)
        .join(GpuRow, col(GpuRow.node_id) == col(NodeRow.id))
        .join(LeaseGpuRow, col(LeaseGpuRow.gpu_id) == col(GpuRow.id))
        .where(LeaseGpuRow.lease_id == lease_id, HELD)
    ).all()
    return [(node, index, observed) for node, index, observed in rows]


def give_back(
    session: Session, lease: LeaseRow, slots: list[tuple[str, int]], *, at: datetime
) -> None:
    """The lease lets go of these GPUs (their ledger rows stay, inactive, released `at`) and
    counts the rest; one statement each, in the caller's transaction, so the set and the count
    change together."""
    gpu_ids = [
        gpu_id
        for gpu_id, node, index in session.exec(
            select(LeaseGpuRow.gpu_id, NodeRow.name, GpuRow.index)
            .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
            .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
            .where(LeaseGpuRow.lease_id == lease.id, HELD)
        ).all()
        if (node, index) in slots
    ]
    lock_gpus(session, gpu_ids)
    session.exec(
        update(LeaseGpuRow)
        .where(col(LeaseGpuRow.lease_id) == lease.id, col(LeaseGpuRow.gpu_id).in_(gpu_ids))
        .values(active=False, released_at=at)
    )
    lease.gpus -= len(gpu_ids)
    session.add(lease)
    session.flush()


def holders(session: Session, lease_ids: list[int]) -> dict[int, str]:
    """The holder of each of these leases."""
    stmt = select(LeaseRow.id, LeaseRow.holder).where(col(LeaseRow.id).in_(lease_ids))
    return {lease_id: holder for lease_id, holder in session.exec(stmt).all() if lease_id}


def lock(session: Session, lease_id: int) -> LeaseRow | None:
    """The lease, locked for a change (None: there is no such lease)."""
    stmt = select(LeaseRow).where(LeaseRow.id == lease_id)
    return session.exec(lock_for_update(session, stmt)).first()


def lock_active(session: Session, lease_id: int, expires_at: datetime) -> LeaseRow | None:
    """The lease, locked, if it is still active and still ends at `expires_at` (None when it
    was released, extended or reclaimed since it was read)."""
    row = lock(session, lease_id)
    if row is None or row.state != LeaseState.ACTIVE or row.expires_at != expires_at:
        return None
    return row


# ---- the sweep's snapshot ---------------------------------------------------------------
# Set-based reads of plain columns: a handful of queries per pass, no ORM objects.

_IN_CHUNK = 5_000  # ids per IN (...) list, well below SQLite's and PostgreSQL's bind limits


def _plain(column: Any, as_type: Any) -> Any:
    """A column read as the driver gives it, past its column type's conversion (which the
    snapshot does itself, for 50,000 leases at 100,000 GPUs, in `_utc` and `_marks`)."""
    return sa.type_coerce(column, as_type).label(column.key)


def _utc_text(column: Any, dialect: str) -> Any:
    """A timestamp read as naive UTC text, as SQLite stores it. PostgreSQL writes it out in
    UTC whatever the session's zone (in ISO form: the driver reads timestamps in no other
    DateStyle), so the driver makes no zoned datetime of each, for `_utc` to convert again:
    a third of the snapshot's conversion time, and no more work for the server."""
    if dialect != "postgresql":
        return _plain(column, sa.String)
    return sa.cast(sa.func.timezone("UTC", column), sa.Text).label(column.key)


def _lease_columns(dialect: str) -> tuple[Any, ...]:
    return (
        col(LeaseRow.id),
        col(LeaseRow.holder),
        col(LeaseRow.team),
        col(LeaseRow.pool),
        col(LeaseRow.gpus),
        col(LeaseRow.priority),
        col(LeaseRow.protected),
        _utc_text(col(LeaseRow.granted_at), dialect),
        _utc_text(col(LeaseRow.expires_at), dialect),
        # As text on both engines: PostgreSQL's driver would decode every lease's JSON, where
        # `_marks` passes over the many empty ones undecoded.
        sa.cast(col(LeaseRow.warnings), sa.Text).label("warnings"),
        _utc_text(col(LeaseRow.snoozed_until), dialect),
    )


_UTC_ZONE = "+00:00"


def _utc(value: Any) -> datetime:
    """A timestamp as `UtcDateTime` reads it: SQLite gives the stored text (UTC, naive),
    PostgreSQL's driver a datetime with its zone."""
    if isinstance(value, str):
        try:  # the zone written into the text: several times faster than replace(tzinfo=)
            return datetime.fromisoformat(value + _UTC_ZONE)
        except ValueError:  # text with a zone of its own
            value = datetime.fromisoformat(value)
    assert isinstance(value, datetime), value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_NO_MARKS = Marks()  # frozen, and its mapping never written to: one serves every unmarked lease


def _marks(value: Any) -> Marks:
    """A lease's marks as `MarksJSON` reads them. Most active leases have none (`{}`), which
    needs no JSON decoding; PostgreSQL's driver gives the object decoded already."""
    if value == "{}":
        return _NO_MARKS
    if isinstance(value, str):
        value = json.loads(value)
    return Marks.of(value if isinstance(value, Mapping) else None)


def _among(db: Connection, column: Any, ids: list[int]) -> sa.ColumnElement[bool]:
    """`column` is one of `ids`, however many: one array on PostgreSQL (a list of thousands of
    parameters takes longer to plan than to run), and on SQLite a list up to _IN_CHUNK, beyond
    it one JSON parameter (SQLite takes at most 32,766 parameters in a statement)."""
    if db.dialect.name == "postgresql":
        array = sa.bindparam(None, ids, type_=postgresql.ARRAY(sa.Integer))
        return column == sa.any_(array)  # type: ignore[no-any-return]
    if len(ids) <= _IN_CHUNK:
        return column.in_(ids)  # type: ignore[no-any-return]
    every = sa.func.json_each(sa.bindparam(None, json.dumps(ids))).table_valued("value")
    return column.in_(sa.select(every.c.value))  # type: ignore[no-any-return]


def _outbox_states(db: Connection, ids: list[int]) -> Iterable[Any]:
    """(id, state, delivered_at) of these outbox rows. PostgreSQL gets the ids as one array:
    a list of thousands of parameters took longer to plan than to run, and to render."""
    dialect = db.dialect.name
    delivered_at = _utc_text(col(OutboxRow.delivered_at), dialect)
    columns = (col(OutboxRow.id), col(OutboxRow.state), delivered_at)
    if dialect == "postgresql":
        if ids:
            every = sa.bindparam("ids", ids, type_=postgresql.ARRAY(sa.Integer))
            yield from db.execute(sa.select(*columns).where(col(OutboxRow.id) == sa.any_(every)))
        return
    for i in range(0, len(ids), _IN_CHUNK):
        yield from db.execute(
            sa.select(*columns).where(col(OutboxRow.id).in_(ids[i : i + _IN_CHUNK]))
        )


def _held_slots(db: Connection, between: Between | None = None) -> dict[int, list[tuple[str, int]]]:
    """The (node, index) of every GPU held now, by lease (`between`: see `active_snapshots`)."""
    slots: dict[int, list[tuple[str, int]]] = {}
    for holding, node, index in fetched(
        db.execute(
            sa.select(col(LeaseGpuRow.lease_id), col(NodeRow.name), col(GpuRow.index))
            .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
            .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
            .where(HELD)
        ),
        between,
    ):  # in chunks of rows: row by row costs a cursor call per GPU held
        slots.setdefault(holding, []).append((node, index))
    return slots


def slots_of_lines(gpus: Iterable[GpuLine]) -> dict[int, list[tuple[str, int]]]:
    """`_held_slots` from the GPUs as the sweep reads them (`storage.sweep_reads.gpu_lines`),
    which name each GPU's active lease: the sweep reads the held GPUs once, not twice."""
    slots: dict[int, list[tuple[str, int]]] = {}
    for line in gpus:
        holding = line[7]
        if holding is not None:
            slots.setdefault(holding, []).append((line[1], line[2]))
    return slots


def active_snapshots(
    session: Session, gpus: Iterable[GpuLine] | None = None, between: Between | None = None
) -> tuple[list[LeaseSnapshot], dict[int, Warned]]:
    """Every active lease as the sweep sees it, and when each of its warnings was delivered.
    `gpus`: every GPU as `storage.sweep_reads.gpu_lines` read it in this transaction (their
    leases' GPUs are then not read again). `between`: called between chunks of the leases
    (`storage.sweep_reads.fetched`)."""
    db = session.connection()
    rows = fetched(
        db.execute(
            sa.select(*_lease_columns(db.dialect.name))
            .where(col(LeaseRow.state) == LeaseState.ACTIVE)
            .order_by(col(LeaseRow.id))
        ),
        between,
    )
    slots = _held_slots(db, between) if gpus is None else slots_of_lines(chunked(gpus, between))
    marked = [_marks(row[9]) for row in chunked(rows, between)]
    owed = [marks.outboxes() if marks.raw else {} for marks in marked]  # used twice below
    outbox_ids = sorted({i for marks in owed for i in marks.values()})
    delivered: dict[int, datetime | None] = {}
    for row_id, state, delivered_at in _outbox_states(db, outbox_ids):
        if state == outbox.DELIVERED and row_id is not None:
            delivered[row_id] = None if delivered_at is None else _utc(delivered_at)
    snapshots, warned = [], {}
    no_warnings = Warned({})
    utc_text = datetime.fromisoformat
    for row, marks, outboxes in chunked(zip(rows, marked, owed, strict=True), between):
        lease_id, holder, team, pool, count, priority, protected, granted, expires, _, snoozed = row
        assert lease_id is not None
        held = slots.get(lease_id)
        try:  # `_utc` of the naive UTC text both engines give, inlined (50,000 leases a pass)
            granted_at, expires_at = utc_text(granted + _UTC_ZONE), utc_text(expires + _UTC_ZONE)
        except (TypeError, ValueError):
            granted_at, expires_at = _utc(granted), _utc(expires)
        snapshots.append(
            LeaseSnapshot(
                lease_id,
                holder,
                team,
                pool,
                count,
                priority,
                bool(protected),
                granted_at,
                expires_at,
                marks,
                None if snoozed is None else _utc(snoozed),
                tuple(sorted(held)) if held else (),
            )
        )
        warned[lease_id] = (
            Warned({reason: delivered.get(i) for reason, i in outboxes.items()})
            if outboxes
            else no_warnings
        )
    return snapshots, warned
