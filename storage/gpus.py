"""GPUs: where each GPU stands, which are free and for whom, and the history of what they
did (nodes and their lifecycle events are `storage.nodes`).

Reads, and the lock of one GPU; callers own the session (and so the transaction). Where a GPU
stands (`Place`) has one definition, used by placement, status, Home, the fleet panel and the
rules' `pool.free`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

import sqlalchemy as sa
from sqlmodel import Session, col, select

from rules.domain import GpuState, Observed
from rules.lease_facts import GpuSnapshot
from rules.policy import Policy
from storage.db import lock_for_update
from storage.leases import HELD
from storage.tables import GpuMinuteRow, GpuRow, LeaseGpuRow, NodeRow


class Place(StrEnum):
    """Where a GPU stands for placement: one name, used by placement, status, Home, the fleet
    panel and the rules' `pool.free`."""

    FREE = "free"  # healthy, undrained, in no active lease, telemetry shows it empty (or unknown)
    LEASED = "leased"
    OCCUPIED = "occupied"  # a process or memory in use, and no lease covers it
    SILENT = "silent"  # not reporting
    OUT = "out"  # unhealthy or drained


@dataclass(frozen=True)
class GpuLine:
    node: str
    index: int
    pool: str
    model: str
    place: Place
    observed: str
    lease_id: int | None
    occupants: tuple[str, ...]  # the Unix users seen on it ("" when unnamed)
    id: int = 0
    state: str = GpuState.OK  # the inventory's own state (rules.domain.GpuState)
    drained: bool = False  # its node is drained


def _place() -> sa.ColumnElement[str]:
    """`Place` in SQL, for a query of GPUs joined to their node and their held lease GPU."""
    return sa.case(
        (col(LeaseGpuRow.lease_id).is_not(None), sa.literal(Place.LEASED.value)),
        (
            sa.or_(col(NodeRow.drained), col(GpuRow.state) != GpuState.OK.value),
            sa.literal(Place.OUT.value),
        ),
        (col(GpuRow.observed) == Observed.SILENT.value, sa.literal(Place.SILENT.value)),
        (col(GpuRow.observed) == Observed.OCCUPIED.value, sa.literal(Place.OCCUPIED.value)),
        else_=sa.literal(Place.FREE.value),
    )


def _placed(*columns: Any) -> sa.Select[Any]:
    """GPUs with their node and the lease holding them (at most one: ix_lease_gpu_active)."""
    held = sa.and_(col(LeaseGpuRow.gpu_id) == col(GpuRow.id), HELD)
    return (
        sa.select(*columns)
        .select_from(GpuRow)
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .outerjoin(LeaseGpuRow, held)
    )


def gpu_lines(
    session: Session,
    pool: str | None = None,
    *,
    nodes: Sequence[str] | None = None,
    ids: Sequence[int] | None = None,
) -> list[GpuLine]:
    """Every GPU (of one pool; only those on `nodes`, or with `ids`) with where it stands, from
    one read of the inventory, the leases and what telemetry last showed (written by the
    device observer)."""
    stmt = _placed(
        col(GpuRow.id),
        col(NodeRow.name),
        col(GpuRow.index),
        col(GpuRow.pool),
        col(GpuRow.model),
        col(GpuRow.state),
        col(NodeRow.drained),
        col(GpuRow.observed),
        col(GpuRow.occupants),
        col(LeaseGpuRow.lease_id),
    ).order_by(col(NodeRow.name), col(GpuRow.index))
    if pool is not None:
        stmt = stmt.where(col(GpuRow.pool) == pool)
    if nodes is not None:
        stmt = stmt.where(col(NodeRow.name).in_(nodes))
    if ids is not None:
        stmt = stmt.where(col(GpuRow.id).in_(ids))
    out = []
    for (
        gpu_id,
        node,
        index,
        gpu_pool,
        model,
        state,
        drained,
        observed,
        occupants,
        lease_id,
    ) in session.connection().execute(stmt).all():
        if lease_id is not None:
            where = Place.LEASED
        elif drained or state != GpuState.OK:
            where = Place.OUT
        elif observed == Observed.SILENT:
            where = Place.SILENT
        elif observed == Observed.OCCUPIED:
            where = Place.OCCUPIED
        else:
            where = Place.FREE
        users = tuple(sorted({str(p.get("user") or "") for p in occupants or []}))
        out.append(
            GpuLine(
                node,
                index,
                gpu_pool,
                model,
                where,
                observed,
                lease_id,
                users,
                id=gpu_id,
                state=state,
                drained=drained,
            )
        )
    return out


@dataclass(frozen=True)
class PlaceCount:
    """How many GPUs of one model in one pool stand in one place (`drained`: their node is)."""

    pool: str
    model: str
    place: Place
    drained: bool
    gpus: int


def place_counts(session: Session) -> list[PlaceCount]:
    """The GPUs counted by pool, model, place and drained node, in SQL: what `/gpu status`
    shows, without a line per GPU."""
    where = _place().label("place")
    stmt = _placed(
        col(GpuRow.pool), col(GpuRow.model), where, col(NodeRow.drained), sa.func.count()
    ).group_by(col(GpuRow.pool), col(GpuRow.model), where, col(NodeRow.drained))
    return [
        PlaceCount(pool, model, Place(place), bool(drained), int(n))
        for pool, model, place, drained, n in session.connection().execute(stmt)
    ]


def stranded(session: Session, pool: str, need: int) -> int:
    """The pool's free GPUs on nodes with fewer than `need` of them free."""
    per_node = (
        _placed(col(GpuRow.node_id), sa.func.count().label("free"))
        .where(col(GpuRow.pool) == pool, _place() == Place.FREE.value)
        .group_by(col(GpuRow.node_id))
        .subquery()
    )
    found = session.connection().execute(
        sa.select(sa.func.coalesce(sa.func.sum(per_node.c.free), 0)).where(per_node.c.free < need)
    )
    return int(found.scalar() or 0)


class FreeGpus(dict[str, list[int]]):
    """{node: free GPU indices}; `unknown` names those free GPUs without fresh telemetry,
    which placement offers last."""

    unknown: frozenset[tuple[str, int]] = frozenset()

    def adding(self, slots: Sequence[tuple[str, int]]) -> FreeGpus:
        """These free GPUs and `slots` (GPUs a person may take although they are in use)."""
        out = FreeGpus({node: list(indices) for node, indices in self.items()})
        for node, index in slots:
            if index not in out.setdefault(node, []):
                out[node].append(index)
        out.unknown = self.unknown
        return out


def free_gpus(session: Session, pool: str) -> FreeGpus:
    """The pool's free GPUs: healthy, on an undrained node, in no active lease, and telemetry
    shows no process and no memory in use beyond the floor (or has no fresh sample yet)."""
    return _free_and_occupied(session, pool, occupied=False)[0]


def free_for(session: Session, policy: Policy, user: str, pool: str) -> FreeGpus:
    """The pool's free GPUs as `user` may take them: the free ones, and those where only the
    user's own processes run (their own work, which their lease would cover)."""
    free, occupied = _free_and_occupied(session, pool, occupied=True)
    return free.adding([(g.node, g.index) for g in occupied if _own(policy, user, g)])


def _free_and_occupied(
    session: Session, pool: str, *, occupied: bool
) -> tuple[FreeGpus, list[GpuLine]]:
    """The pool's free GPUs and (with `occupied`) the lines of those occupied without a lease,
    in one read of plain columns: the free ones are most of a large pool, so no line each."""
    place = _place()
    places = [Place.FREE.value, Place.OCCUPIED.value] if occupied else [Place.FREE.value]
    stmt = (
        _placed(col(NodeRow.name), col(GpuRow.index), col(GpuRow.observed), place, col(GpuRow.id))
        .where(col(GpuRow.pool) == pool, place.in_(places))
        .order_by(col(NodeRow.name), col(GpuRow.index))
    )
    free = FreeGpus()
    unknown = set()
    taken: list[int] = []
    for node, index, observed, where, gpu_id in session.connection().execute(stmt).all():
        if where == Place.OCCUPIED:
            taken.append(gpu_id)
            continue
        free.setdefault(node, []).append(index)
        if observed != Observed.EMPTY:
            unknown.add((node, index))
    free.unknown = frozenset(unknown)
    lines = gpu_lines(session, pool, ids=taken) if taken else []
    return free, lines


def _own(policy: Policy, user: str, line: GpuLine) -> bool:
    return (
        line.place == Place.OCCUPIED
        and bool(line.occupants)
        and all(policy.accounts.get(u) == user for u in line.occupants)
    )


def claimable(
    session: Session, policy: Policy, user: str, pool: str, slots: Sequence[tuple[str, int]]
) -> bool:
    """May `user` take exactly these GPUs of `pool`: each is free, or occupied only by processes
    of the user's own Unix accounts (the one-click borrow of one's own unreserved process)?"""
    if not slots:
        return False
    lines = {(g.node, g.index): g for g in slot_lines(session, pool, slots)}
    for slot in slots:
        line = lines.get(slot)
        if line is None or not (line.place == Place.FREE or _own(policy, user, line)):
            return False
    return True


def slot_lines(session: Session, pool: str, slots: Sequence[tuple[str, int]]) -> list[GpuLine]:
    """The lines of the pool's GPUs on the nodes `slots` name (a few nodes, not the pool)."""
    nodes = sorted({node for node, _ in slots})
    return [g for g in gpu_lines(session, pool, nodes=nodes) if (g.node, g.index) in slots]


def gpu_ids(session: Session, slots: list[tuple[str, int]]) -> list[int]:
    """Database ids of (node, index) slots, in the same order."""
    ids = []
    for node, index in slots:
        gpu_id = session.exec(
            select(GpuRow.id)
            .join(NodeRow, col(GpuRow.node_id) == col(NodeRow.id))
            .where(NodeRow.name == node, GpuRow.index == index)
        ).one()
        assert gpu_id is not None
        ids.append(gpu_id)
    return ids


def lock(session: Session, gpu_id: int) -> GpuRow:
    """The GPU, locked for a change."""
    return session.exec(lock_for_update(session, select(GpuRow).where(GpuRow.id == gpu_id))).one()


def gpu_snapshots(session: Session) -> list[GpuSnapshot]:
    """Every GPU with its inventory state and lease, by id: the sweep's view of `gpu_lines`."""
    return [
        GpuSnapshot(g.id, g.node, g.index, g.model, g.pool, g.state, g.drained, g.lease_id)
        for g in sorted(gpu_lines(session), key=lambda g: g.id)
    ]


# ---- the device observer's reads and writes ----------------------------------------------


@dataclass(frozen=True)
class ObservedGpu:
    """One GPU as the device observer compares it with telemetry."""

    id: int
    node: str
    index: int
    observed: str
    occupants: list[dict[str, Any]]
    uuid: str | None
    model: str
    memory_mib: int
    profiled_at: datetime | None


def observed_gpus(session: Session) -> list[ObservedGpu]:
    """Every GPU as the observer last wrote it down. Plain columns, no ORM objects: this runs
    after every poll, over every GPU."""
    rows = session.connection().execute(
        sa.select(
            col(GpuRow.id),
            col(NodeRow.name),
            col(GpuRow.index),
            col(GpuRow.observed),
            col(GpuRow.occupants),
            col(GpuRow.uuid),
            col(GpuRow.model),
            col(GpuRow.memory_mib),
            col(GpuRow.profiled_at),
        )
        .join(NodeRow, col(GpuRow.node_id) == col(NodeRow.id))
        .order_by(col(NodeRow.name), col(GpuRow.index))
    )
    return [
        ObservedGpu(gpu_id, node, index, observed, list(occupants or []), uuid, model, memory, at)
        for gpu_id, node, index, observed, occupants, uuid, model, memory, at in rows
    ]


def update_gpus(session: Session, updates: Mapping[int, Mapping[str, Any]]) -> None:
    """One UPDATE ... executemany per set of changed columns: plain statements, no ORM rows."""
    db = session.connection()
    table = GpuRow.__table__  # type: ignore[attr-defined]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for gpu_id, change in updates.items():
        uuid = change.get("uuid")
        if uuid:  # a card moved here from another slot: it is no longer there
            db.execute(
                sa.update(table).where(table.c.uuid == uuid, table.c.id != gpu_id).values(uuid=None)
            )
        keys = tuple(sorted(change))
        groups.setdefault(keys, []).append(
            {"gpu_id": gpu_id, **{f"new_{k}": v for k, v in change.items()}}
        )
    for keys, params in groups.items():
        values = {k: sa.bindparam(f"new_{k}", type_=table.c[k].type) for k in keys}
        stmt = sa.update(table).where(table.c.id == sa.bindparam("gpu_id")).values(values)
        db.execute(stmt, params)


def set_reporting(session: Session, changes: Mapping[str, tuple[str, str]], now: datetime) -> None:
    """Each changed node's reporting state, since `now`: {node: (before, now)}."""
    for name, (_, state) in changes.items():
        node = session.exec(select(NodeRow).where(NodeRow.name == name)).first()
        if node is not None:
            node.reporting, node.reporting_since = state, now
            session.add(node)


# ---- history: per-minute rollups, stored, read back for reports, pruned after retention --


def store_minutes(session: Session, rows: Sequence[GpuMinuteRow]) -> int:
    """Insert `rows`, skipping any (node, index, minute) already stored (a rollup retried after
    a failed commit, or two bot processes overlapping in a restart). Returns how many went in."""
    if not rows:
        return 0
    minutes = {row.minute for row in rows}
    stored = session.exec(
        select(GpuMinuteRow.node, GpuMinuteRow.index, GpuMinuteRow.minute).where(
            col(GpuMinuteRow.minute).in_(minutes)
        )
    ).all()
    seen = {(node, index, minute) for node, index, minute in stored}
    fresh = []
    for row in rows:
        key = (row.node, row.index, row.minute)
        if key not in seen:
            seen.add(key)
            fresh.append({name: getattr(row, name) for name in _MINUTE_COLUMNS})
    if fresh:
        # One executemany of plain values: a poll of 10,000 GPUs stores 10,000 rows a minute,
        # which as ORM objects cost the idle process a fifth of its CPU
        session.connection().execute(sa.insert(GpuMinuteRow.__table__), fresh)  # type: ignore[attr-defined]
    return len(fresh)


_MINUTE_COLUMNS = (
    "node",
    "index",
    "minute",
    "util_avg_pct",
    "util_max_pct",
    "memory_used_max_mib",
    "samples",
    "ok_samples",
)


def stored_minutes(
    session: Session,
    node: str,
    since: datetime,
    until: datetime,
    index: int | None = None,
) -> list[GpuMinuteRow]:
    """The stored minutes of `node` (one GPU of it with `index`) in [since, until), in order."""
    query = select(GpuMinuteRow).where(
        GpuMinuteRow.node == node,
        col(GpuMinuteRow.minute) >= since,
        col(GpuMinuteRow.minute) < until,
    )
    if index is not None:
        query = query.where(GpuMinuteRow.index == index)
    ordered = query.order_by(col(GpuMinuteRow.index), col(GpuMinuteRow.minute))
    return list(session.exec(ordered).all())


def prune_minutes(session: Session, older_than: datetime) -> int:
    """Delete the minutes before `older_than` (the retention job); returns how many."""
    result = session.execute(sa.delete(GpuMinuteRow).where(col(GpuMinuteRow.minute) < older_than))
    return int(cast(Any, result).rowcount or 0)
