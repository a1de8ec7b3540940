"""The figures /metrics exposes, read in a few grouped queries at scrape time: counts per pool,
team, node, state or reason, never one object per GPU or lease.

Reads only; callers own the session. Every figure comes from the database, so it is the same
whichever process answers the scrape, and survives restarts.
"""

from __future__ import annotations

from dataclasses import dataclass
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

_audit = AuditRow.__table__  # type: ignore[attr-defined]  # SQLModel sets it at class creation


def gpu_states(session: Session) -> list[tuple[str, str, int]]:
    """(pool, state, GPUs) where state is where the GPU stands, as `storage.gpus.Place` sees
    it, with "out" told apart: leased, drained (its node or itself), unhealthy, unknown (the
    inventory's own unknown), silent (not reporting), occupied (in use without a lease), free."""
    # The bare column matches the partial index ix_lease_gpu_active on SQLite (`= 1` does not).
    held = sa.and_(col(LeaseGpuRow.gpu_id) == col(GpuRow.id), sa.literal_column("lease_gpu.active"))
    state = sa.case(
        (col(LeaseGpuRow.lease_id).is_not(None), "leased"),
        (col(NodeRow.drained), GpuState.DRAINED.value),
        (col(GpuRow.state) != GpuState.OK.value, col(GpuRow.state)),
        (col(GpuRow.observed) == Observed.SILENT.value, "silent"),
        (col(GpuRow.observed) == Observed.OCCUPIED.value, "occupied"),
        else_="free",
    ).label("place")
    stmt = (
        sa.select(col(GpuRow.pool), state, sa.func.count())
        .select_from(GpuRow)
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .outerjoin(LeaseGpuRow, held)
        .group_by(col(GpuRow.pool), state)
    )
    return [(str(p), str(s), int(n)) for p, s, n in session.connection().execute(stmt)]


@dataclass(frozen=True)
class NodeFigure:
    name: str
    pool: str
    reporting: str  # rules.domain.Reporting
    profiled_at: datetime | None  # the newest telemetry profile written for any of its GPUs


def node_figures(session: Session) -> list[NodeFigure]:
    """Every node with its reporting state and when telemetry last profiled one of its GPUs
    (the device observer writes a profile at least every few minutes while samples arrive)."""
    newest = sa.func.max(col(GpuRow.profiled_at))
    stmt = (
        sa.select(col(NodeRow.name), col(NodeRow.pool), col(NodeRow.reporting), newest)
        .select_from(NodeRow)
        .outerjoin(GpuRow, col(GpuRow.node_id) == col(NodeRow.id))
        .group_by(col(NodeRow.id), col(NodeRow.name), col(NodeRow.pool), col(NodeRow.reporting))
    )
    return [
        NodeFigure(str(name), str(pool), str(reporting), _aware(at))
        for name, pool, reporting, at in session.connection().execute(stmt)
    ]


def held_gpus(session: Session) -> dict[tuple[str, str], int]:
    """GPUs held in active leases, by (pool, team)."""
    stmt = (
        sa.select(col(LeaseRow.pool), col(LeaseRow.team), sa.func.sum(col(LeaseRow.gpus)))
        .where(col(LeaseRow.state) == LeaseState.ACTIVE.value)
        .group_by(col(LeaseRow.pool), col(LeaseRow.team))
    )
    return {(str(p), str(t)): int(n or 0) for p, t, n in session.connection().execute(stmt)}


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


def requests_by_outcome(session: Session) -> list[tuple[str, str, str, str, int]]:
    """(pool, team, kind, outcome, requests) over every request ever filed; outcome is what
    the rules said (approve, ask, queue, deny)."""
    stmt = sa.select(
        col(RequestRow.pool),
        col(RequestRow.team),
        col(RequestRow.kind),
        col(RequestRow.outcome),
        sa.func.count(),
    ).group_by(
        col(RequestRow.pool), col(RequestRow.team), col(RequestRow.kind), col(RequestRow.outcome)
    )
    return [(str(p), str(t), str(k), str(o), int(n)) for p, t, k, o, n in _rows(session, stmt)]


def reclaims(session: Session) -> list[tuple[str, str, str, int]]:
    """(pool, team, reason, leases) over every lease ever reclaimed."""
    reason = col(LeaseRow.end_reason)
    stmt = (
        sa.select(col(LeaseRow.pool), col(LeaseRow.team), reason, sa.func.count())
        .where(col(LeaseRow.state) == LeaseState.RECLAIMED.value)
        .group_by(col(LeaseRow.pool), col(LeaseRow.team), reason)
    )
    return [(str(p), str(t), str(r or "unknown"), int(n)) for p, t, r, n in _rows(session, stmt)]


def gpu_seconds(session: Session, now: datetime) -> dict[tuple[str, str], float]:
    """GPU-seconds leases held, by (pool, team): each lease GPU from the grant to when it was
    given back, the lease ended, or `now` for what is still held."""
    end = sa.func.coalesce(
        col(LeaseGpuRow.released_at),
        col(LeaseRow.ended_at),
        sa.bindparam("now", now, UtcDateTime()),
    )
    seconds = _seconds_between(session, col(LeaseRow.granted_at), end)
    never_held = (
        LeaseState.PENDING.value,
        LeaseState.QUEUED.value,
        LeaseState.DENIED.value,
        LeaseState.CANCELLED.value,
    )
    stmt = (
        sa.select(col(LeaseRow.pool), col(LeaseRow.team), sa.func.sum(seconds))
        .select_from(LeaseRow)
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .where(col(LeaseRow.state).not_in(never_held))
        .group_by(col(LeaseRow.pool), col(LeaseRow.team))
    )
    return {(str(p), str(t)): max(0.0, float(s or 0)) for p, t, s in _rows(session, stmt)}


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
