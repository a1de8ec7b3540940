"""The figures /metrics exposes, read in a few grouped queries at scrape time: counts per pool,
team, node, state or reason, never one object per GPU or lease.

Reads only; callers own the session. Every figure comes from the database, so it is the same
whichever process answers the scrape, and survives restarts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col

from rules.domain import GpuState, LeaseState, Observed, RequestState
from storage import keyvalue, outbox
from storage.audit import GENESIS_HASH, chain_hash
from storage.inbox import PENDING as INBOX_PENDING
from storage.tables import (
    AuditHeadRow,
    AuditRow,
    GpuRow,
    InboxRow,
    LeaseGpuRow,
    LeaseRow,
    MetricsCheckpointRow,
    NodeRow,
    OutboxRow,
    RequestRow,
    UtcDateTime,
)

_audit = AuditRow.__table__  # type: ignore[attr-defined]  # SQLModel sets it at class creation


def one_snapshot(session: Session) -> None:
    """Make the session's reads see one snapshot: a lease that ends between two of a scrape's
    queries must not count both as active and as ended, or the counter would dip. (SQLite's
    read transaction is one snapshot already.) Call it before the first read."""
    if session.get_bind().dialect.name == "postgresql" and not session.in_transaction():
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


@dataclass(frozen=True)
class NodeFigure:
    name: str
    pool: str
    reporting: str  # rules.domain.Reporting
    # Seconds since telemetry last profiled any of its GPUs (None: never).
    telemetry_age_s: float | None


@dataclass(frozen=True)
class Fleet:
    states: dict[tuple[str, str], int]  # (pool, state) -> GPUs
    nodes: list[NodeFigure]  # by name


def fleet(session: Session, now: datetime) -> Fleet:
    """GPUs by pool and where they stand, and every node with its reporting state and how
    long ago telemetry last profiled one of its GPUs (written at least every few minutes
    while samples arrive): two grouped passes over the GPUs, the ages worked out in SQL, so
    that 12,500 nodes cost no parsing of times in Python.

    Where a GPU stands is `storage.gpus.Place`, with "out" told apart: leased, drained (its
    node or itself; a drained node's GPUs are out of service unless a lease still holds
    them), unhealthy, unknown (the inventory's own unknown), silent (not reporting),
    occupied (in use without a lease), free."""
    # The bare column matches the partial index ix_lease_gpu_active on SQLite (`= 1` does not).
    held = sa.and_(col(LeaseGpuRow.gpu_id) == col(GpuRow.id), sa.literal_column("lease_gpu.active"))
    place = sa.case(
        (col(LeaseGpuRow.gpu_id).is_not(None), "leased"),
        (sa.literal_column("node.drained"), GpuState.DRAINED.value),
        (col(GpuRow.state) != GpuState.OK.value, col(GpuRow.state)),
        (col(GpuRow.observed) == Observed.SILENT.value, "silent"),
        (col(GpuRow.observed) == Observed.OCCUPIED.value, "occupied"),
        else_="free",
    ).label("place")
    by_place = (
        sa.select(col(NodeRow.pool), place, sa.func.count())
        .select_from(GpuRow)
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .outerjoin(LeaseGpuRow, held)
        .group_by(col(NodeRow.pool), place)
    )
    states = {(str(pool), str(state)): int(n) for pool, state, n in _rows(session, by_place)}
    newest = (
        sa.select(col(GpuRow.node_id), sa.func.max(col(GpuRow.profiled_at)).label("at"))
        .group_by(col(GpuRow.node_id))
        .subquery()
    )
    age = _seconds_between(session, newest.c.at, sa.bindparam("now", now, UtcDateTime()))
    nodes = (
        sa.select(col(NodeRow.name), col(NodeRow.pool), col(NodeRow.reporting), age)
        .select_from(NodeRow)
        .outerjoin(newest, newest.c.node_id == col(NodeRow.id))
        .order_by(col(NodeRow.name))
    )
    figures = [
        NodeFigure(str(name), str(pool), str(reporting), None if s is None else float(s))
        for name, pool, reporting, s in _rows(session, nodes)
    ]
    return Fleet(states, figures)


@dataclass(frozen=True)
class Waiting:
    pool: str
    state: str  # pending (for a person) or queued (for GPUs)
    count: int
    oldest: datetime | None


def waiting(session: Session) -> list[Waiting]:
    """Open requests by pool and state, with the oldest one's creation time."""
    states = (RequestState.PENDING.value, RequestState.QUEUED.value)
    stmt = (
        sa.select(
            col(RequestRow.pool),
            col(RequestRow.state),
            sa.func.count(),
            sa.func.min(col(RequestRow.created_at)),
        )
        .where(col(RequestRow.state).in_(states))
        .group_by(col(RequestRow.pool), col(RequestRow.state))
    )
    return [
        Waiting(str(p), str(s), int(n), _aware(at))
        for p, s, n, at in session.connection().execute(stmt)
    ]


#: Lease states that may still change (a final lease's figures never do).
OPEN = (LeaseState.PENDING.value, LeaseState.QUEUED.value, LeaseState.ACTIVE.value)
#: Final leases that held GPUs: ended with `ended_at` (bot.services.leases.end_lease).
HELD_FINAL = (LeaseState.RELEASED.value, LeaseState.RECLAIMED.value, LeaseState.EXPIRED.value)
RECLAIMED = LeaseState.RECLAIMED.value

RequestKey = tuple[str, str, str, str]  # pool, team, kind, outcome
ReclaimKey = tuple[str, str, str]  # pool, team, reason
TeamKey = tuple[str, str]  # pool, team


@dataclass(frozen=True)
class Totals:
    """The history counters up to `upto` (None: the beginning, nothing counted): requests
    filed before it by (pool, team, kind, outcome), leases reclaimed before it by (pool, team,
    reason) and the GPU-seconds held by the leases that ended before it, by (pool, team).

    A filed request and an ended lease never change again, so totals up to a time stay true
    once every transaction that could write before it has committed."""

    upto: datetime | None = None
    requests: dict[RequestKey, int] = field(default_factory=dict)
    reclaims: dict[ReclaimKey, int] = field(default_factory=dict)
    gpu_s: dict[TeamKey, float] = field(default_factory=dict)

    def plus(self, more: Totals) -> Totals:
        """These totals and `more` (what came after them), up to `more.upto`."""
        return Totals(
            more.upto,
            _summed(self.requests, more.requests),
            _summed(self.reclaims, more.reclaims),
            _summed(self.gpu_s, more.gpu_s),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": [[*key, n] for key, n in sorted(self.requests.items())],
            "reclaims": [[*key, n] for key, n in sorted(self.reclaims.items())],
            "gpu_s": [[*key, s] for key, s in sorted(self.gpu_s.items())],
        }

    @classmethod
    def from_json(cls, upto: datetime, data: dict[str, Any]) -> Totals:
        return cls(
            upto,
            {(str(p), str(t), str(k), str(o)): int(n) for p, t, k, o, n in data["requests"]},
            {(str(p), str(t), str(r)): int(n) for p, t, r, n in data["reclaims"]},
            {(str(p), str(t)): float(sec) for p, t, sec in data["gpu_s"]},
        )


def totals_between(session: Session, since: datetime | None, until: datetime | None) -> Totals:
    """The requests filed and the leases ended with `since` <= time < `until` (either end
    open: None). Grouped in SQL, so even the whole history reads no row into Python; a span
    after `since` (minutes, at each scrape) reads through the `created_at` and `ended_at`
    indexes alone, which is why the lease states are told apart in the grouping."""
    created, ended = col(RequestRow.created_at), col(LeaseRow.ended_at)
    keys = (
        col(RequestRow.pool),
        col(RequestRow.team),
        col(RequestRow.kind),
        col(RequestRow.outcome),
    )
    asked = (
        sa.select(*keys, sa.func.count())
        .where(*_span(session, created, since, until))
        .group_by(*keys)
    )
    requests = {(str(p), str(t), str(k), str(o)): int(n) for p, t, k, o, n in _rows(session, asked)}
    state, reason = col(LeaseRow.state), col(LeaseRow.end_reason)
    reclaimed = (
        sa.select(col(LeaseRow.pool), col(LeaseRow.team), state, reason, sa.func.count())
        .where(*_span(session, ended, since, until), *_only(state, since, [RECLAIMED]))
        .group_by(col(LeaseRow.pool), col(LeaseRow.team), state, reason)
    )
    reclaims: dict[ReclaimKey, int] = {}
    for pool, team, how, why, count in _rows(session, reclaimed):
        if how == RECLAIMED:
            key = (str(pool), str(team), str(why or "unknown"))
            reclaims[key] = reclaims.get(key, 0) + int(count)
    end = sa.func.coalesce(col(LeaseGpuRow.released_at), ended)
    seconds = _seconds_between(session, col(LeaseRow.granted_at), end)
    held = (
        sa.select(col(LeaseRow.pool), col(LeaseRow.team), state, sa.func.sum(seconds))
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .where(*_span(session, ended, since, until), *_only(state, since, HELD_FINAL))
        .group_by(col(LeaseRow.pool), col(LeaseRow.team), state)
    )
    gpu_s: dict[TeamKey, float] = {}
    for pool, team, how, total in _rows(session, held):
        if how in HELD_FINAL:
            key2 = (str(pool), str(team))
            gpu_s[key2] = gpu_s.get(key2, 0.0) + max(0.0, float(total or 0))
    return Totals(until, requests, reclaims, gpu_s)


def _only(state: Any, since: datetime | None, states: Sequence[str]) -> list[Any]:
    """Over the whole history, the states' index picks the rows; after a time, the time's
    index does, and the grouping tells the states apart."""
    return [state.in_(states)] if since is None else []


def _span(
    session: Session, column: Any, since: datetime | None, until: datetime | None
) -> list[Any]:
    where = [column.is_not(None)]
    if since is not None:
        after = column >= sa.bindparam(None, since, UtcDateTime())
        if session.get_bind().dialect.name == "sqlite":
            # SQLite keeps no statistics: told that few rows are this recent, it reads them
            # through the time's index instead of scanning an index that suits the grouping.
            after = sa.func.likelihood(after, sa.literal_column("0.001"))
        where.append(after)
    if until is not None:
        where.append(column < sa.bindparam(None, until, UtcDateTime()))
    return where


def checkpoint(session: Session) -> Totals | None:
    """The totals the leader last stored (None: never yet)."""
    row = session.get(MetricsCheckpointRow, 1)
    return None if row is None else Totals.from_json(row.upto, row.totals)


def store_checkpoint(session: Session, totals: Totals, at: datetime) -> bool:
    """Keep `totals` as the checkpoint, unless the one stored already reaches as far (a
    checkpoint only moves on); whether it was written."""
    assert totals.upto is not None
    row = session.get(MetricsCheckpointRow, 1, with_for_update=True)
    if row is not None and row.upto >= totals.upto:
        return False
    row = row or MetricsCheckpointRow(id=1)
    row.upto, row.totals, row.written_at = totals.upto, totals.as_json(), at
    session.add(row)
    return True


def _summed(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> dict[Any, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + value
    return out


@dataclass(frozen=True)
class Active:
    held: dict[tuple[str, str], int]  # GPUs the active leases hold now, by (pool, team)
    gpu_s: dict[tuple[str, str], float]  # GPU-seconds they held so far, by (pool, team)


def active_leases(session: Session, now: datetime) -> Active:
    """What the active leases hold, and the GPU-seconds they held so far: each lease GPU from
    the grant to when a shrink gave it back, or to `now`, by (pool, team)."""
    end = sa.func.coalesce(col(LeaseGpuRow.released_at), sa.bindparam("now", now, UtcDateTime()))
    seconds = _seconds_between(session, col(LeaseRow.granted_at), end)
    holding = sa.case((sa.literal_column("lease_gpu.active"), 1), else_=0)
    stmt = (
        sa.select(
            col(LeaseRow.pool), col(LeaseRow.team), sa.func.sum(holding), sa.func.sum(seconds)
        )
        .select_from(LeaseRow)
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .where(col(LeaseRow.state) == LeaseState.ACTIVE.value)
        .group_by(col(LeaseRow.pool), col(LeaseRow.team))
    )
    held, gpu_s = {}, {}
    for pool, team, gpus, total in _rows(session, stmt):
        key = (str(pool), str(team))
        held[key], gpu_s[key] = int(gpus or 0), max(0.0, float(total or 0))
    return Active(held, gpu_s)


def outbox_states(session: Session) -> dict[str, int]:
    """Outbox rows by state (pending, sending, delivered, dropped, failed)."""
    return outbox.counts(session)


def oldest_owed(session: Session) -> datetime | None:
    """When the oldest message still owed (pending or being sent) was written."""
    states = (outbox.PENDING, outbox.SENDING)
    stmt = sa.select(sa.func.min(col(OutboxRow.created_at))).where(col(OutboxRow.state).in_(states))
    return _aware(session.connection().execute(stmt).scalar())


def inbox_backlog(session: Session) -> tuple[int, datetime | None]:
    """Acknowledged requests not carried out yet, and when the oldest was received."""
    stmt = sa.select(sa.func.count(), sa.func.min(col(InboxRow.received_at))).where(
        col(InboxRow.state) == INBOX_PENDING
    )
    count, oldest = session.connection().execute(stmt).one()
    return int(count), _aware(oldest)


def paused_since(session: Session) -> datetime | None:
    """When an admin paused automation from Slack (None: not paused there)."""
    return keyvalue.paused_since(session)


def audit_chain_ok(session: Session) -> bool:
    """A cheap check of the audit chain's end, for every scrape: the head row names the last
    row and its hash, that row hashes to what it stores, and it follows the row before it.
    (`gpubot audit verify` walks the whole chain; this catches a truncated or edited tail.)"""
    head = session.get(AuditHeadRow, 1)
    last = (
        session.connection()
        .execute(sa.select(_audit).order_by(_audit.c.id.desc()).limit(1))
        .first()
    )
    if last is None:
        return head is None or head.last_id == 0
    if head is None:
        return False
    row = last._mapping
    if (head.last_id, head.last_hash) != (row["id"], row["hash"]):
        return False
    if chain_hash(row["prev_hash"], row) != row["hash"]:
        return False
    if row["id"] == 1:
        return bool(row["prev_hash"] == GENESIS_HASH)
    before = (
        session.connection()
        .execute(sa.select(_audit.c.hash).where(_audit.c.id == row["id"] - 1))
        .scalar()
    )
    return bool(before == row["prev_hash"])


# ---- helpers -----------------------------------------------------------------------------


def _seconds_between(session: Session, start: Any, end: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return sa.extract("epoch", end - start)
    return (sa.func.julianday(end) - sa.func.julianday(start)) * 86400.0


def _rows(session: Session, stmt: Any) -> Any:
    return session.connection().execute(stmt)


def _aware(value: object) -> datetime | None:
    """A time from a bare aggregate (SQLite hands back text) as an aware UTC datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
