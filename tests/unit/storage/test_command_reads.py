"""The counted reads of `/gpu status` and of a borrow's placement give what the GPUs' lines
give, on random fleets: counts moved by lease, drained node, state and telemetry, and the
nodes placement takes GPUs from told from per-node counts."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlmodel import Session, col

from rules.domain import GpuState, Observed
from rules.placement import place
from storage import gpus, leases
from storage.db import Database
from storage.gpus import FreeGpus, Place, placing_nodes
from storage.leases import HELD
from storage.tables import GpuRow, LeaseGpuRow, NodeRow, PoolRow
from tests.builders import default_policy
from tests.unit.storage.builders import a_lease

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SEEDS = range(4)


def a_random_fleet(session: Session, rng: random.Random) -> list[int]:
    """Two pools (a100 with two models), nodes of 1-8 GPUs, some drained; GPUs in every
    state and telemetry reading; leases (active, ended, and one that gave a GPU back) over
    some of them. The GPU ids."""
    for pool in ("a100", "l40s"):
        session.add(PoolRow(name=pool))
    session.flush()
    ids: list[int] = []
    for k in range(rng.randint(6, 14)):
        pool = rng.choice(("a100", "a100", "l40s"))
        node = NodeRow(name=f"node-{k:02d}", pool=pool, drained=rng.random() < 0.2)
        session.add(node)
        session.flush()
        assert node.id is not None
        for index in range(rng.randint(1, 8)):
            gpu = GpuRow(
                node_id=node.id,
                index=index,
                pool=pool,
                model=rng.choice(("A100", "A100-80")) if pool == "a100" else "L40S",
                state=GpuState.OK if rng.random() < 0.8 else GpuState.UNHEALTHY,
                observed=rng.choice(list(Observed)),
                occupants=[{"pid": 1, "user": rng.choice(("alice", "bob"))}],
            )
            session.add(gpu)
            session.flush()
            assert gpu.id is not None
            ids.append(gpu.id)
    a100 = [g.id for g in gpus.gpu_lines(session, "a100")]  # the builder's leases are of a100
    rng.shuffle(a100)
    taken = a100[: len(a100) // 2]
    for start in range(0, len(taken), 3):
        a_lease(session, at=NOW, gpu_ids=taken[start : start + 3])
    a_lease(session, at=NOW, gpu_ids=a100[len(a100) // 2 :][:4], state="released")
    return ids


def counted_from_lines(session: Session) -> Counter[tuple[str, str, Place, bool]]:
    found: Counter[tuple[str, str, Place, bool]] = Counter()
    for line in gpus.gpu_lines(session):
        found[line.pool, line.model, line.place, line.drained] += 1
    return found


@pytest.mark.parametrize("seed", SEEDS)
def test_status_counts_are_those_of_the_gpus_lines(database: Database, seed: int) -> None:
    """Every (pool, model, place, drained) count equals the GPUs' lines counted one by one."""
    with database.write() as session:
        a_random_fleet(session, random.Random(seed))
    with database.read() as session:
        expected = counted_from_lines(session)
        counts = gpus.place_counts(session)
    assert expected == Counter({(c.pool, c.model, c.place, c.drained): c.gpus for c in counts})
    assert all(c.gpus > 0 for c in counts)


def test_status_counts_nothing_without_gpus(database: Database) -> None:
    """No GPU stored: no count, rather than a count of nothing."""
    with database.write() as session:
        session.add(PoolRow(name="a100"))
    with database.read() as session:
        assert [] == gpus.place_counts(session)


def test_status_counts_a_held_gpu_on_a_drained_node_as_leased(database: Database) -> None:
    """A drained node's GPUs are out of service, except those still held: leased, drained."""
    with database.write() as session:
        session.add(PoolRow(name="a100"))
        session.flush()
        node = NodeRow(name="node-01", pool="a100", drained=True)
        session.add(node)
        session.flush()
        assert node.id is not None
        ids = []
        for index in range(3):
            gpu = GpuRow(node_id=node.id, index=index, pool="a100", model="A100")
            session.add(gpu)
            session.flush()
            assert gpu.id is not None
            ids.append(gpu.id)
        a_lease(session, at=NOW, gpu_ids=ids[:1])
    with database.read() as session:
        counts = {(c.place, c.drained): c.gpus for c in gpus.place_counts(session)}
    assert {(Place.LEASED, True): 1, (Place.OUT, True): 2} == counts


def a_free_map(rng: random.Random) -> FreeGpus:
    free = FreeGpus()
    unknown = set()
    for k in range(rng.randint(0, 12)):
        node = f"node-{k:02d}"
        indices = sorted(rng.sample(range(8), rng.randint(1, 8)))
        free[node] = indices
        unknown |= {(node, i) for i in indices if rng.random() < 0.4}
    free.unknown = frozenset(unknown)
    return free


@pytest.mark.parametrize("seed", range(300))
def test_placement_on_the_nodes_told_from_counts_is_placement_on_all(seed: int) -> None:
    """`place` over just the nodes `placing_nodes` names chooses what it chooses over all."""
    rng = random.Random(seed)
    free = a_free_map(rng)
    count = rng.randint(0, 20)
    counts = {
        node: (len(indices), sum((node, i) not in free.unknown for i in indices))
        for node, indices in free.items()
    }
    nodes = placing_nodes(counts, count)
    subset = FreeGpus({node: free[node] for node in nodes})
    subset.unknown = frozenset(slot for slot in free.unknown if slot[0] in nodes)
    assert place(free, count, free.unknown) == place(subset, count, subset.unknown)


@pytest.mark.parametrize("seed", SEEDS)
def test_free_gpus_for_placing_place_as_all_of_them(database: Database, seed: int) -> None:
    """Read for placing n GPUs, the free GPUs give the same placement and the same count as
    all of them read one by one; a person's own busy GPUs count as theirs to take. The free
    GPUs counted in SQL are those read one by one."""
    policy = replace(default_policy(), accounts={"alice": "U1"})
    with database.write() as session:
        a_random_fleet(session, random.Random(seed))
    with database.read() as session:
        for pool in ("a100", "l40s"):
            every = gpus.free_for(session, policy, "U1", pool)
            for count in range(0, 10):
                some = gpus.free_for(session, policy, "U1", pool, placing=count)
                assert every.count() == some.count()
                assert place(every, count, every.unknown) == place(some, count, some.unknown)
            assert gpus.free_gpus(session, pool).count() == gpus.free_count(session, pool)


def held_now(session: Session) -> tuple[set[int], set[int]]:
    """The GPUs `gpu.held` names, and those in an active lease GPU row."""
    db = session.connection()
    flagged = {i or 0 for (i,) in db.execute(sa.select(col(GpuRow.id)).where(col(GpuRow.held)))}
    active = {i for (i,) in db.execute(sa.select(col(LeaseGpuRow.gpu_id)).where(HELD))}
    return flagged, active


@pytest.mark.parametrize("seed", SEEDS)
def test_held_is_kept_by_the_database_through_grants_shrinks_and_releases(
    database: Database, seed: int
) -> None:
    """`gpu.held` is true exactly for the GPUs of active lease GPU rows, whatever changes
    them: leases granted, a GPU given back, leases ended, a lease GPU deleted."""
    rng = random.Random(seed)
    with database.write() as session:
        ids = a_random_fleet(session, rng)
        flagged, active = held_now(session)
        assert (flagged, active) == (active, active)
        assert active
        some = sorted(active)[0]
        session.execute(
            sa.update(LeaseGpuRow)
            .where(col(LeaseGpuRow.gpu_id) == some, HELD)
            .values(active=False, released_at=NOW)
        )
        assert held_now(session)[0] == held_now(session)[1]
        lease = session.execute(sa.select(col(LeaseGpuRow.lease_id)).where(HELD)).scalars().first()
        leases.let_go(session, lease)
        assert held_now(session)[0] == held_now(session)[1]
        session.execute(sa.delete(LeaseGpuRow).where(HELD))
        free = [i for i in ids if i not in active][:2]
        a_lease(session, at=NOW, gpu_ids=free)
        flagged, active = held_now(session)
        assert (set(free), set(free)) == (flagged, active)


# Names a locale's collation orders otherwise than their code points (case, and punctuation
# it skips at first): placement breaks ties by name as Python compares them.
TIE_NAMES = ("node_b", "Node-a", "node-a", "nodeb", "NODE.c", "node.a", "node-B", "nodea")


@pytest.mark.parametrize("seed", SEEDS)
def test_the_node_a_borrow_fits_on_is_the_one_placement_takes(
    database: Database, seed: int
) -> None:
    """Placing GPUs that one node holds, told from one row of SQL (`best_fit`), takes what
    placement over every free GPU takes, also where nodes tie on their free GPUs and only
    their names part them; more than any node holds is left to the counts of every node."""
    rng = random.Random(seed)
    with database.write() as session:
        session.add(PoolRow(name="a100"))
        session.flush()
        for name in rng.sample(TIE_NAMES, len(TIE_NAMES)):
            node = NodeRow(name=name, pool="a100")
            session.add(node)
            session.flush()
            assert node.id is not None
            for index in range(rng.choice((2, 4, 4, 6))):
                observed = rng.choice((Observed.EMPTY, Observed.EMPTY, Observed.UNKNOWN))
                session.add(GpuRow(node_id=node.id, index=index, pool="a100", observed=observed))
    policy = default_policy()
    with database.read() as session:
        every = gpus.free_for(session, policy, "U9", "a100")
        for count in range(1, 8):
            some = gpus.free_for(session, policy, "U9", "a100", placing=count)
            assert every.count() == some.count()
            assert place(every, count, every.unknown) == place(some, count, some.unknown)
        assert gpus.best_fit(session, "a100", 7) is None


def test_a_pool_with_nothing_free_places_nothing(database: Database) -> None:
    with database.write() as session:
        session.add(PoolRow(name="a100"))
    with database.read() as session:
        free = gpus.free_for(session, default_policy(), "U1", "a100", placing=2)
    assert (0, None) == (free.count(), place(free, 2, free.unknown))
