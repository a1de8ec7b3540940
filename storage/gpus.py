"""GPUs: where each GPU stands, which are free and for whom, and the history of what they
did (nodes and their lifecycle events are `storage.nodes`).

Reads, and the lock of one GPU; callers own the session (and so the transaction). Where a GPU
stands (`Place`) has one definition, used by placement, status, Home, the fleet panel and the
rules' `pool.free`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import cache
from typing import Any, cast

import sqlalchemy as sa
from sqlmodel import Session, col, select

from rules.domain import GpuState, Observed
from rules.lease_facts import GpuSnapshot
from rules.policy import Policy
from storage.db import lock_for_update
from storage.leases import HELD, lock_gpus
from storage.tables import GpuMinuteRow, GpuRow, LeaseGpuRow, NodeRow, PoolRow


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


def _counted(*columns: Any) -> sa.Select[Any]:
    """GPUs with their node, for reads that ask only whether a GPU is held (`gpu.held`), not
    by which lease."""
    return (
        sa.select(*columns)
        .select_from(GpuRow)
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
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
        elif drained:
            where = Place.OUT
        else:
            where = _own_place(state, observed)
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


def _own_place(state: str, observed: str) -> Place:
    """Where a GPU neither held nor on a drained node stands, by its own columns."""
    if state != GpuState.OK:
        return Place.OUT
    if observed == Observed.SILENT:
        return Place.SILENT
    if observed == Observed.OCCUPIED:
        return Place.OCCUPIED
    return Place.FREE


def place_counts(session: Session) -> list[PlaceCount]:
    """The GPUs counted by pool, model, place and drained node: what `/gpu status` shows,
    without a line per GPU, and without a join per GPU either. Every GPU is counted by what
    the inventory, telemetry and `held` say of it from one index alone; the GPUs on drained
    nodes (what `Place` puts before the GPU's own columns, but for a lease) are counted apart
    and moved to their place."""
    db = session.connection()
    held = col(GpuRow.held)
    facts = (col(GpuRow.pool), col(GpuRow.model), col(GpuRow.state), col(GpuRow.observed), held)
    every = db.execute(_kinds_counted(lateral=db.dialect.name == "postgresql")).all()
    out_nodes = [i for (i,) in db.execute(sa.select(col(NodeRow.id)).where(col(NodeRow.drained)))]
    # the drained nodes' GPUs, through ix_gpu_node_id (few: counted here, not in SQL, where
    # grouping them would walk the whole GPU index instead)
    drained: Counter[tuple[str, str, str, str, bool]] = Counter()
    if out_nodes:
        for pool, model, state, observed, is_held in db.execute(
            sa.select(*facts).where(col(GpuRow.node_id).in_(out_nodes))
        ):
            drained[pool, model, state, observed, bool(is_held)] += 1
    rest: Counter[tuple[str, str, str, str, bool]] = Counter()
    for pool, model, state, observed, is_held, n in every:
        rest[pool, model, state, observed, bool(is_held)] += int(n)
    out: Counter[tuple[str, str, Place, bool]] = Counter()
    for (pool, model, state, observed, is_held), n in drained.items():
        rest[pool, model, state, observed, bool(is_held)] -= n
        out[pool, model, Place.LEASED if is_held else Place.OUT, True] += n
    for (pool, model, state, observed, is_held), n in rest.items():
        where = Place.LEASED if is_held else _own_place(state, observed)
        out[pool, model, where, False] += n
    return [
        PlaceCount(pool, model, place, drained_node, n)
        for (pool, model, place, drained_node), n in out.items()
        if n > 0
    ]


#: The columns of ix_gpu_pool_held_state_observed_model that tell where a GPU stands, in the
#: index's order.
_KIND = ("pool", "held", "state", "observed", "model")


@cache  # built once: building the statement costs more than running it
def _kinds_counted(*, lateral: bool = False) -> sa.Select[Any]:
    """Every distinct (pool, model, state, observed, held) of the GPUs with how many GPUs have
    it, from ix_gpu_pool_held_state_observed_model alone.

    A GROUP BY reads and compares all five columns of every GPU. Here the kinds (a handful,
    however large the fleet) are found by seeking from one to the next in the index (a
    loose index scan), and each is counted over its own range of the index, which only
    steps over the entries. The range is told by the fewest leading columns that no other
    kind shares (for most kinds: the pool, and whether the GPU is held), since each step
    compares the entry with those columns; up to two, it is a range of ix_gpu_pool_held,
    whose small entries fill fewer pages (what a read reloads after any write). With
    `lateral` (PostgreSQL), the next kind is read in a LATERAL subquery, so that a table
    without statistics yet is not read whole to join it."""
    gpu = GpuRow.__table__  # type: ignore[attr-defined]
    g, n = gpu.alias("g"), gpu.alias("n")
    order = [g.c[name] for name in _KIND]
    zero = sa.literal_column("0", sa.Integer)
    first = sa.select(g.c.id).order_by(*order).limit(1).scalar_subquery()
    # seq: the kinds in index order; split: the first column where a kind differs from the
    # one before it (0 for the first)
    kinds = (
        sa.select(*(n.c[name] for name in _KIND), zero.label("seq"), zero.label("split"))
        .where(n.c.id == first)
        .cte("kinds", recursive=True)
    )

    def first_after(level: int) -> sa.ScalarSelect[Any]:
        """The id of the first GPU whose kind follows this one's at `level` (same before)."""
        same = [g.c[name] == kinds.c[name] for name in _KIND[:level]]
        after = g.c[_KIND[level]] > kinds.c[_KIND[level]]
        found = sa.select(g.c.id).where(*same, after).order_by(*order).limit(1)
        return found.correlate(kinds).scalar_subquery()

    following = sa.func.coalesce(*(first_after(level) for level in reversed(range(len(_KIND)))))
    if lateral:  # the next kind's GPU read by its key, whatever the planner knows of the table
        found = (
            sa.select(*(n.c[name] for name in _KIND))
            .where(n.c.id == following)
            .limit(1)  # one row by its key anyway; it keeps the subquery from becoming a join
            .lateral()
        )
        nxt: Any = found.c
        joined = kinds.join(found, sa.true())
    else:
        nxt = n.c
        joined = kinds.join(n, n.c.id == following)
    split = sa.case(
        *((nxt[name] != kinds.c[name], sa.literal_column(str(i))) for i, name in enumerate(_KIND)),
        else_=sa.literal_column(str(len(_KIND) - 1)),
    )
    step = sa.select(
        *(nxt[name] for name in _KIND), (kinds.c.seq + 1).label("seq"), split.label("split")
    ).select_from(joined)
    kinds = kinds.union_all(step)
    ahead = sa.func.lead(kinds.c.split).over(order_by=kinds.c.seq)
    each = sa.select(
        *(kinds.c[name] for name in _KIND),
        kinds.c.split,
        sa.func.coalesce(ahead, 0).label("ahead"),
    ).subquery("each")

    def counted(columns: int) -> sa.ScalarSelect[Any]:
        """How many GPUs share the kind's first `columns` columns."""
        same = (g.c[name] == each.c[name] for name in _KIND[:columns])
        return sa.select(sa.func.count()).select_from(g).where(*same).scalar_subquery()

    shortest = sa.case(
        *(
            (sa.and_(each.c.split < columns, each.c.ahead < columns), counted(columns))
            for columns in range(1, len(_KIND))
        ),
        else_=counted(len(_KIND)),
    )
    return sa.select(
        each.c.pool, each.c.model, each.c.state, each.c.observed, each.c.held, shortest
    )


def stranded(session: Session, pool: str, need: int) -> int:
    """The pool's free GPUs on nodes with fewer than `need` of them free."""
    return sum(free for free, _ in free_per_node(session, pool).values() if free < need)


class FreeGpus(dict[str, list[int]]):
    """{node: free GPU indices}; `unknown` names those free GPUs without fresh telemetry,
    which placement offers last. `total`: the pool's free GPUs, when the map lists only the
    nodes a placement would take them from (None: it lists them all)."""

    unknown: frozenset[tuple[str, int]] = frozenset()
    total: int | None = None

    def count(self) -> int:
        """The pool's free GPUs, however many nodes the map lists."""
        return self.total if self.total is not None else sum(len(v) for v in self.values())

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
    return _free_on(session, pool)


def free_for(
    session: Session, policy: Policy, user: str, pool: str, *, placing: int | None = None
) -> FreeGpus:
    """The pool's free GPUs as `user` may take them: the free ones, and those where only the
    user's own processes run (their own work, which their lease would cover).

    With `placing`, only the nodes that `rules.placement.place` takes that many GPUs from are
    listed, and `total` counts the rest: the free GPUs of a large pool are counted per node in
    SQL rather than read one by one."""
    own = [(g.node, g.index) for g in _occupied(session, pool) if _own(policy, user, g)]
    if placing is None:
        return _free_on(session, pool).adding(own)
    if placing == 0:  # only the count: no node is read GPU by GPU
        out = FreeGpus()
        out.total = free_count(session, pool) + len(own)
        return out
    fit = None if own else best_fit(session, pool, placing)
    if fit is not None:  # one node holds them: the common case, told by SQL alone
        node, free, total = fit
        counts = {node: (free, 0)}
    else:
        # the user's own GPUs count as free on their nodes, or the GPUs span nodes: placement
        # weighs every node's count
        counts = free_per_node(session, pool)
        for node, _ in own:  # the user's own GPUs have fresh telemetry: they are known
            free, known = counts.get(node, (0, 0))
            counts[node] = (free + 1, known + 1)
        total = sum(free for free, _ in counts.values())
    nodes = placing_nodes(counts, placing)
    out = (_free_on(session, pool, nodes) if nodes else FreeGpus()).adding(
        [slot for slot in own if slot[0] in nodes]
    )
    if sum(len(out.get(node, ())) for node in nodes) < sum(counts[n][0] for n in nodes):
        # a GPU of those nodes was taken or turned busy between the two reads (PostgreSQL
        # reads each statement afresh): place over the whole pool, as without `placing`
        return _free_on(session, pool).adding(own)
    out.total = total
    return out


def _free_here(pool: str) -> tuple[sa.ColumnElement[bool], ...]:
    """`Place.FREE` in a pool written out as plain conditions, for a query of `_counted`: the
    CASE of `_place` would hide the GPU's columns from the indexes that hold them."""
    return (
        col(GpuRow.pool) == pool,
        _not_held(),
        col(GpuRow.state) == GpuState.OK.value,
        col(GpuRow.observed).not_in([Observed.SILENT.value, Observed.OCCUPIED.value]),
        sa.not_(col(NodeRow.drained)),
    )


def _not_held() -> sa.ColumnElement[bool]:
    """In no active lease, asked of `gpu.held` (kept by the database from lease_gpu), which the
    GPU index holds: no probe of the lease index for each GPU."""
    return col(GpuRow.held) == sa.false()


def _free_on(session: Session, pool: str, nodes: Collection[str] | None = None) -> FreeGpus:
    """The pool's free GPUs (only those on `nodes`), in one read of plain columns: the free
    ones are most of a large pool, so no line each."""
    stmt = (
        _counted(col(NodeRow.name), col(GpuRow.index), col(GpuRow.observed))
        .where(*_free_here(pool))
        .order_by(col(NodeRow.name), col(GpuRow.index))
    )
    if nodes is not None:
        stmt = stmt.where(col(NodeRow.name).in_(sorted(nodes)))
    free = FreeGpus()
    unknown = set()
    for node, index, observed in session.connection().execute(stmt).all():
        free.setdefault(node, []).append(index)
        if observed != Observed.EMPTY:
            unknown.add((node, index))
    free.unknown = frozenset(unknown)
    return free


def free_count(session: Session, pool: str) -> int:
    """How many GPUs of the pool are free, counted in SQL."""
    stmt = _counted(sa.func.count()).where(*_free_here(pool))
    return int(session.connection().execute(stmt).scalar() or 0)


def free_per_node(session: Session, pool: str) -> dict[str, tuple[int, int]]:
    """The pool's free GPUs counted per node, in SQL: {node: (free GPUs, of them those with
    fresh telemetry showing them empty)}; nodes with none free are left out."""
    known = sa.func.sum(sa.case((col(GpuRow.observed) == Observed.EMPTY.value, 1), else_=0))
    stmt = (
        _counted(col(NodeRow.name), sa.func.count(), known)
        .where(*_free_here(pool))
        .group_by(col(NodeRow.name))
    )
    return {
        node: (int(free), int(empty or 0))
        for node, free, empty in session.connection().execute(stmt)
    }


def best_fit(session: Session, pool: str, count: int) -> tuple[str, int, int] | None:
    """The node `placing_nodes` takes `count` GPUs from when one node holds them all, told in
    SQL from the free GPUs counted per node, so that a borrow reads one row rather than a
    line per node of the pool: (node, its free GPUs, the pool's free GPUs); None when no node
    has `count` free (placement then spans nodes and weighs them all)."""
    free = sa.func.count()
    known = sa.func.sum(sa.case((col(GpuRow.observed) == Observed.EMPTY.value, 1), else_=0))
    unknown_taken = sa.case((count - known > 0, count - known), else_=0)
    name: Any = col(NodeRow.name)
    if session.get_bind().dialect.name == "postgresql":
        name = name.collate("C")  # by code point, as Python compares names in placing_nodes
    stmt = (
        _counted(col(NodeRow.name), free, sa.func.sum(free).over())
        .where(*_free_here(pool))
        .group_by(col(NodeRow.name))
        .order_by(sa.case((free >= count, 0), else_=1), unknown_taken, free, name)
        .limit(1)
    )
    row = session.connection().execute(stmt).first()
    if row is None or row[1] < count:
        return None
    return str(row[0]), int(row[1]), int(row[2])


def placing_nodes(counts: Mapping[str, tuple[int, int]], count: int) -> set[str]:
    """The nodes `rules.placement.place` takes `count` GPUs from, told from the free GPUs
    counted per node ({node: (free, known)}, known: with fresh telemetry, which placement
    offers first); empty when they are too few. Placement run on just these nodes chooses
    what it chooses on them all: a node that fits wins on (GPUs of unknown state it would
    take, free GPUs, name); otherwise the fullest nodes are taken, then the tightest fit."""
    if count <= 0 or sum(free for free, _ in counts.values()) < count:
        return set()
    fits = [node for node, (free, _) in counts.items() if free >= count]
    if fits:
        return {
            min(fits, key=lambda n: (max(0, count - counts[n][1]), counts[n][0], n)),
        }
    chosen: set[str] = set()
    remaining = sorted(counts, key=lambda n: (-counts[n][0], n))
    while count > 0:
        fit = next((n for n in reversed(remaining) if counts[n][0] >= count), None)
        node = fit or remaining[0]
        chosen.add(node)
        count -= min(count, counts[node][0])
        remaining.remove(node)
    return chosen


def _occupied(session: Session, pool: str) -> list[GpuLine]:
    """The lines of the pool's GPUs in use without a lease (see `occupied_lines`)."""
    return occupied_lines(session, pool)


def occupied_lines(session: Session, pool: str | None = None) -> list[GpuLine]:
    """The lines of the GPUs (of one pool) in use without a lease, healthy, on an undrained
    node (`Place.OCCUPIED`), in node and index order: few, and found through the index that
    holds what telemetry showed, one pool after another, rather than a line for every GPU."""
    pools = [pool] if pool is not None else sa.select(col(PoolRow.name)).scalar_subquery()
    stmt = _counted(col(GpuRow.id)).where(
        col(GpuRow.pool).in_(pools),
        _not_held(),
        col(GpuRow.state) == GpuState.OK.value,
        col(GpuRow.observed) == Observed.OCCUPIED.value,
        sa.not_(col(NodeRow.drained)),
    )
    taken = [gpu_id for (gpu_id,) in session.connection().execute(stmt)]
    if not taken:
        return []
    # A GPU leased between the two reads (PostgreSQL reads each at its own instant) is not
    # in use without a lease any more.
    return [line for line in gpu_lines(session, pool, ids=taken) if line.place == Place.OCCUPIED]


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
    lock_gpus(session, updates)  # in id order, as every writer of several GPUs (held triggers)
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
