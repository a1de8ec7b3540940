"""The figures /metrics exposes, read in a few grouped queries at scrape time: counts per pool,
team, node, state or reason, never one object per GPU or lease.

Reads only; callers own the session. Every figure comes from the database, so it is the same
whichever process answers the scrape, and survives restarts.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    NodeRow,
    OutboxRow,
    RequestRow,
    UtcDateTime,
)

_CHUNK = 500  # ids in one IN (...)
#: Leases that never held a GPU (asked, waiting or refused).
_NEVER_HELD = (LeaseState.DENIED.value, LeaseState.CANCELLED.value)
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
    profiled_at: datetime | None  # the newest telemetry profile written for any of its GPUs


@dataclass(frozen=True)
class Fleet:
    states: dict[tuple[str, str], int]  # (pool, state) -> GPUs
    nodes: list[NodeFigure]


def fleet(session: Session) -> Fleet:
    """GPUs by pool and where they stand, and every node with its reporting state and when
    telemetry last profiled one of its GPUs (written at least every few minutes while samples
    arrive), from one pass over the GPUs grouped by node.

    Where a GPU stands is `storage.gpus.Place`, with "out" told apart: leased, drained (its
    node or itself), unhealthy, unknown (the inventory's own unknown), silent (not reporting),
    occupied (in use without a lease), free."""
    # The bare column matches the partial index ix_lease_gpu_active on SQLite (`= 1` does not).
    held = sa.and_(col(LeaseGpuRow.gpu_id) == col(GpuRow.id), sa.literal_column("lease_gpu.active"))
    place = sa.case(
        (col(LeaseGpuRow.gpu_id).is_not(None), "leased"),
        (col(GpuRow.state) != GpuState.OK.value, col(GpuRow.state)),
        (col(GpuRow.observed) == Observed.SILENT.value, "silent"),
        (col(GpuRow.observed) == Observed.OCCUPIED.value, "occupied"),
        else_="free",
    ).label("place")
    by_node = (
        sa.select(col(GpuRow.node_id), place, sa.func.count(), sa.func.max(col(GpuRow.profiled_at)))
        .select_from(GpuRow)
        .outerjoin(LeaseGpuRow, held)
        .group_by(col(GpuRow.node_id), place)
    )
    nodes: dict[int, tuple[str, str, bool, str]] = {
        int(node_id or 0): (str(name), str(pool), bool(drained), str(reporting))
        for node_id, name, pool, drained, reporting in session.connection().execute(
            sa.select(
                col(NodeRow.id),
                col(NodeRow.name),
                col(NodeRow.pool),
                col(NodeRow.drained),
                col(NodeRow.reporting),
            )
        )
    }
    states: dict[tuple[str, str], int] = {}
    newest: dict[int, datetime] = {}
    for node_id, state, count, profiled in session.connection().execute(by_node):
        _, pool, drained, _ = nodes[node_id]
        # A drained node's GPUs are out of service unless a lease still holds them.
        key = (pool, GpuState.DRAINED.value if drained and state != "leased" else str(state))
        states[key] = states.get(key, 0) + int(count)
        at = _aware(profiled)
        if at is not None and (node_id not in newest or at > newest[node_id]):
            newest[node_id] = at
    figures = [
        NodeFigure(name, pool, reporting, newest.get(node_id))
        for node_id, (name, pool, _, reporting) in nodes.items()
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


def newest_ids(session: Session) -> tuple[int, int]:
    """The highest lease id and the highest request id written so far."""
    lease = sa.select(sa.func.max(col(LeaseRow.id)))
    request = sa.select(sa.func.max(col(RequestRow.id)))
    conn = session.connection()
    return int(conn.execute(lease).scalar() or 0), int(conn.execute(request).scalar() or 0)


def request_counts(
    session: Session, after: int, upto: int | None = None
) -> dict[tuple[str, str, str, str], int]:
    """Requests with `after` < id <= `upto` (no upper end: None) by (pool, team, kind, outcome);
    outcome is what the rules said (approve, ask, queue, deny), fixed when a request is filed."""
    keys = (
        col(RequestRow.pool),
        col(RequestRow.team),
        col(RequestRow.kind),
        col(RequestRow.outcome),
    )
    stmt = sa.select(*keys, sa.func.count()).where(col(RequestRow.id) > after).group_by(*keys)
    if upto is not None:
        stmt = stmt.where(col(RequestRow.id) <= upto)
    return {(str(p), str(t), str(k), str(o)): int(n) for p, t, k, o, n in _rows(session, stmt)}


@dataclass
class LeaseTally:
    """What final leases add up to: GPU-seconds held by (pool, team), reclaims by (pool,
    team, reason); and the ids of the leases looked at that are still open."""

    gpu_s: dict[tuple[str, str], float] = field(default_factory=dict)
    reclaims: dict[tuple[str, str, str], int] = field(default_factory=dict)
    open_ids: set[int] = field(default_factory=set)

    def add(self, other: LeaseTally) -> None:
        for key, seconds in other.gpu_s.items():
            self.gpu_s[key] = self.gpu_s.get(key, 0.0) + seconds
        for reason, count in other.reclaims.items():
            self.reclaims[reason] = self.reclaims.get(reason, 0) + count
        self.open_ids |= other.open_ids


def final_leases(
    session: Session, *, after: int = 0, upto: int | None = None, ids: Iterable[int] = ()
) -> LeaseTally:
    """The final leases (released, reclaimed, expired ...) with `after` < id <= `upto`, or
    with the given `ids`: each lease GPU from the grant to when it was given back or the lease
    ended; the open ones among them are only named."""
    tally = LeaseTally()
    wanted = sorted(ids)
    chunks = [wanted[i : i + _CHUNK] for i in range(0, len(wanted), _CHUNK)] if wanted else [None]
    for chunk in chunks:
        where: list[Any] = (
            [col(LeaseRow.id).in_(chunk)] if chunk is not None else [col(LeaseRow.id) > after]
        )
        if chunk is None and upto is not None:
            where.append(col(LeaseRow.id) <= upto)
        _tally(session, where, tally)
    return tally


def _tally(session: Session, where: list[Any], tally: LeaseTally) -> None:
    """Grouped in SQL, so a first count over a long history reads no lease into Python."""
    opened = sa.select(col(LeaseRow.id)).where(*where, col(LeaseRow.state).in_(OPEN))
    tally.open_ids |= {int(i) for (i,) in _rows(session, opened)}
    reason = col(LeaseRow.end_reason)
    reclaimed = (
        sa.select(col(LeaseRow.pool), col(LeaseRow.team), reason, sa.func.count())
        .where(*where, col(LeaseRow.state) == LeaseState.RECLAIMED.value)
        .group_by(col(LeaseRow.pool), col(LeaseRow.team), reason)
    )
    for pool, team, why, count in _rows(session, reclaimed):
        key = (str(pool), str(team), str(why or "unknown"))
        tally.reclaims[key] = tally.reclaims.get(key, 0) + int(count)
    end = sa.func.coalesce(col(LeaseGpuRow.released_at), col(LeaseRow.ended_at))
    seconds = _seconds_between(session, col(LeaseRow.granted_at), end)
    held = (
        sa.select(col(LeaseRow.pool), col(LeaseRow.team), sa.func.sum(seconds))
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .where(*where, col(LeaseRow.state).not_in(_NEVER_HELD + OPEN))
        .group_by(col(LeaseRow.pool), col(LeaseRow.team))
    )
    for pool, team, total in _rows(session, held):
        key2 = (str(pool), str(team))
        tally.gpu_s[key2] = tally.gpu_s.get(key2, 0.0) + max(0.0, float(total or 0))


def open_lease_ids(session: Session, upto: int) -> set[int]:
    """The ids up to `upto` of leases still open (pending, queued or active)."""
    stmt = sa.select(col(LeaseRow.id)).where(
        col(LeaseRow.state).in_(OPEN), col(LeaseRow.id) <= upto
    )
    return {int(i) for (i,) in _rows(session, stmt)}


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


def settled_ids(session: Session, before: datetime) -> tuple[int, int]:
    """The highest lease id granted, and the highest request id filed, before `before`: every
    row up to them was committed long ago (ids are handed out before commit, so a newer id can
    be visible while an older one is still in flight)."""
    conn = session.connection()
    lease = conn.execute(
        sa.select(sa.func.max(col(LeaseRow.id))).where(col(LeaseRow.granted_at) < before)
    ).scalar()
    request = conn.execute(
        sa.select(sa.func.max(col(RequestRow.id))).where(col(RequestRow.created_at) < before)
    ).scalar()
    return int(lease or 0), int(request or 0)


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
