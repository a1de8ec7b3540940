"""A lease giving back some GPUs: the set and the count change together, the GPUs it gave back
are free for another lease (the active-GPU index allows it), and what it held once it ended is
still known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlmodel import select

from storage import leases, nodes, usage
from storage.db import Database
from storage.tables import GpuRow, LeaseRow
from tests.unit.storage.builders import a_lease
from tests.unit.storage.test_leases import a_fleet

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODE = "a100-node-01"


def test_giving_back_changes_the_set_and_the_count_together(database: Database) -> None:
    """Two of four go back: the lease holds and counts two, and the team holds two."""
    with database.write() as session:
        lease_id = a_lease(session, at=NOW, gpu_ids=a_fleet(session))
    with database.write() as session:
        row = leases.lock(session, lease_id)
        assert row is not None
        leases.give_back(session, row, [(NODE, 2), (NODE, 3), ("elsewhere", 0)], at=NOW)
    with database.read() as session:
        row = leases.get(session, lease_id)
        assert row is not None
        assert 2 == row.gpus
        assert [(NODE, 0), (NODE, 1)] == sorted(leases.slots_of(session, lease_id))
        assert [(NODE, 0, "unknown"), (NODE, 1, "unknown")] == sorted(
            leases.held_seen(session, lease_id)
        )
        assert {"vision": 2} == leases.held_by_team(session, "a100")
        assert 2 == len(leases.held_gpus(session))


def test_a_gpu_given_back_may_be_leased_again(database: Database) -> None:
    """The unique index over active lease GPUs lets another lease take it."""
    with database.write() as session:
        gpus = a_fleet(session)
        first = a_lease(session, at=NOW, gpu_ids=gpus)
    with database.write() as session:
        row = leases.lock(session, first)
        assert row is not None
        leases.give_back(session, row, [(NODE, 3)], at=NOW)
    with database.write() as session:
        second = a_lease(session, at=NOW, gpu_ids=gpus[3:], holder="U2")
    with database.read() as session:
        assert [(NODE, 3)] == leases.slots_of(session, second)
        assert {first: 3, second: 1} == {
            r.id: r.gpus for r in session.exec(select(LeaseRow)).all() if r.id is not None
        }
        assert 4 == len(session.exec(select(GpuRow)).all())


def test_an_ended_lease_shows_what_it_held_at_its_end(database: Database) -> None:
    """Once every GPU is let go (the lease ended), its slots are those it held at its end: a
    GPU it gave back earlier is not among them, and its ledger row says when it went back."""
    with database.write() as session:
        lease_id = a_lease(session, at=NOW - timedelta(hours=1), gpu_ids=a_fleet(session)[:2])
    with database.write() as session:
        row = leases.lock(session, lease_id)
        assert row is not None
        leases.give_back(session, row, [(NODE, 1)], at=NOW - timedelta(minutes=20))
        leases.let_go(session, lease_id)
    with database.read() as session:
        assert [(NODE, 0)] == sorted(leases.slots_of(session, lease_id))
        assert [(NODE, 0, None), (NODE, 1, NOW - timedelta(minutes=20))] == sorted(
            (node, index, released) for node, index, _, _, released in nodes.holdings(session)
        )


def test_a_gpu_given_back_counts_in_recent_use_only_until_it_went_back(
    database: Database,
) -> None:
    """Two GPUs for an hour, one given back after 20 minutes: 80 GPU-minutes, not 120."""
    with database.write() as session:
        lease_id = a_lease(session, at=NOW - timedelta(hours=1), gpu_ids=a_fleet(session)[:2])
    with database.write() as session:
        row = leases.lock(session, lease_id)
        assert row is not None
        leases.give_back(session, row, [(NODE, 1)], at=NOW - timedelta(minutes=40))
        leases.let_go(session, lease_id)
        row.state, row.ended_at = "released", NOW
        session.add(row)
    with database.read() as session:
        since = NOW - timedelta(days=1)
        used = usage.held_usage(session, "U1", since, NOW, busy_pct=50.0, prices={})
    assert 80 * 60 == used.allocated_s


def test_a_lease_reclaimed_after_a_shrink_was_reclaimed_only_from_what_it_held(
    database: Database,
) -> None:
    """A process left on a GPU given back earlier is not a leftover of the reclaim."""
    with database.write() as session:
        gpus = a_fleet(session)[:2]
        lease_id = a_lease(session, at=NOW - timedelta(hours=1), gpu_ids=gpus)
    with database.write() as session:
        row = leases.lock(session, lease_id)
        assert row is not None
        leases.give_back(session, row, [(NODE, 1)], at=NOW - timedelta(minutes=40))
        leases.let_go(session, lease_id)
        row.state, row.ended_at = "reclaimed", NOW
        session.add(row)
    with database.read() as session:
        since = NOW - timedelta(hours=1)
        found = [leases.reclaimed_from(session, gpu, since) for gpu in gpus]
    assert [{"U1"}, set()] == found
