"""The figures /metrics exposes, read in a few grouped queries at scrape time: counts per pool,
team, node, state or reason, never one object per GPU or lease.

Reads only; callers own the session. Every figure comes from the database, so it is the same
whichever process answers the scrape, and survives restarts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

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


def one_snapshot(session: Session) -> None:
    """Make the session's reads see one snapshot: a lease that ends between two of a scrape's
    queries must not count both as active and as ended, or the counter would dip. (SQLite's
    read transaction is one snapshot already.) Call it before the first read."""
    if session.get_bind().dialect.name == "postgresql" and not session.in_transaction():
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


class NodeFigure(NamedTuple):
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
    while samples arrive).

    Where a GPU stands is `storage.gpus.Place`, with "out" told apart: leased, drained (its
    node or itself; a drained node's GPUs are out of service unless a lease still holds
    them), unhealthy, unknown (the inventory's own unknown), silent (not reporting),
    occupied (in use without a lease), free. As in `storage.gpus.place_counts`, no GPU is
    joined to anything: every GPU is counted by what the inventory, telemetry and `held` say
    of it from ix_gpu_pool_held_state_observed_model alone, and those on drained nodes (few)
    are counted apart and moved to their place."""
    db = session.connection()
    held = col(GpuRow.held)
    facts = (col(GpuRow.pool), held, col(GpuRow.state), col(GpuRow.observed))
    every = db.execute(sa.select(*facts, sa.func.count()).group_by(*facts)).all()
    out_nodes = [i for (i,) in db.execute(sa.select(col(NodeRow.id)).where(col(NodeRow.drained)))]
    drained = (
        db.execute(
            sa.select(*facts, sa.func.count())
            .where(col(GpuRow.node_id).in_(out_nodes))
            .group_by(*facts)
        ).all()
        if out_nodes
        else []
    )
    rest: Counter[tuple[str, bool, str, str]] = Counter()  # not on a drained node
    for pool, is_held, state, observed, n in every:
        rest[pool, bool(is_held), state, observed] += int(n)
    states: Counter[tuple[str, str]] = Counter()
    for pool, is_held, state, observed, n in drained:
        rest[pool, bool(is_held), state, observed] -= int(n)
        states[pool, "leased" if is_held else GpuState.DRAINED.value] += int(n)
    for (pool, is_held, state, observed), n in rest.items():
        states[pool, "leased" if is_held else _own_place(state, observed)] += n
    return Fleet(
        {(str(p), str(s)): n for (p, s), n in states.items() if n > 0}, nodes(session, now)
    )


def _own_place(state: str, observed: str) -> str:
    """Where a GPU neither held nor on a drained node stands, by its own columns."""
    if state != GpuState.OK.value:
        return state
    if observed == Observed.SILENT.value:
        return "silent"
    if observed == Observed.OCCUPIED.value:
        return "occupied"
    return "free"


def nodes(session: Session, now: datetime) -> list[NodeFigure]:
    """Every node by name, with its reporting state and its telemetry's age: one probe of
    ix_gpu_node_profiled per node for its newest `profiled_at`, the age worked out in SQL, so
    that 12,500 nodes cost no parsing of times in Python."""
    newest = (
        sa.select(sa.func.max(col(GpuRow.profiled_at)))
        .where(col(GpuRow.node_id) == col(NodeRow.id))
        .scalar_subquery()
    )
    age = seconds_between(session, newest, sa.bindparam("now", now, UtcDateTime()))
    stmt = sa.select(col(NodeRow.name), col(NodeRow.pool), col(NodeRow.reporting), age).order_by(
        col(NodeRow.name)
    )
    return list(map(NodeFigure._make, _rows(session, stmt).all()))


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


@dataclass(frozen=True)
class Active:
    held: dict[tuple[str, str], int]  # GPUs the active leases hold now, by (pool, team)
    gpu_s: dict[tuple[str, str], float]  # GPU-seconds they held so far, by (pool, team)


def active_leases(session: Session, now: datetime) -> Active:
    """What the active leases hold, and the GPU-seconds they held so far: each lease GPU from
    the grant to when a shrink gave it back, or to `now`, by (pool, team).

    An active lease's `gpus` counts the GPUs it holds (storage.leases.give_back changes both
    together), so the held ones are summed from ix_lease_active_team_pool_granted alone,
    without a row per GPU; only the GPUs a shrink gave back are read one by one, through
    ix_lease_gpu_given_back."""
    until = sa.bindparam("now", now, UtcDateTime())
    lease_gpus, granted = col(LeaseRow.gpus), col(LeaseRow.granted_at)
    # Written out, not bound: the partial index's condition must be seen to hold.
    active = sa.text(f"lease.state = '{LeaseState.ACTIVE.value}'")
    team = (col(LeaseRow.pool), col(LeaseRow.team))
    holding = (
        sa.select(
            *team,
            sa.func.sum(lease_gpus),
            sa.func.sum(lease_gpus * seconds_between(session, granted, until)),
        )
        .where(active)
        .group_by(*team)
    )
    held: dict[tuple[str, str], int] = {}
    gpu_s: dict[tuple[str, str], float] = {}
    for pool, team_name, gpus, total in _rows(session, holding):
        key = (str(pool), str(team_name))
        held[key], gpu_s[key] = int(gpus or 0), float(total or 0)
    released = col(LeaseGpuRow.released_at)
    given_back = (
        sa.select(*team, sa.func.sum(seconds_between(session, granted, released)))
        .select_from(LeaseGpuRow)
        .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
        .where(released.is_not(None), active)
        .group_by(*team)
    )
    for pool, team_name, total in _rows(session, given_back):
        key = (str(pool), str(team_name))
        gpu_s[key] = gpu_s.get(key, 0.0) + float(total or 0)
        held.setdefault(key, 0)
    return Active(held, {key: max(0.0, s) for key, s in gpu_s.items()})


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


def seconds_between(session: Session, start: Any, end: Any) -> Any:
    """`end - start` in seconds, in SQL."""
    if session.get_bind().dialect.name == "postgresql":
        # date_part gives a double; EXTRACT a numeric (PostgreSQL 14 on), which costs several
        # times as much over the whole history, and then a Decimal per node age
        return sa.func.date_part(sa.literal_column("'epoch'"), end - start, type_=sa.Float)
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
