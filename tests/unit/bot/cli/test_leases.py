"""`gpubot leases`: the active leases as a table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from storage.db import Database
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, PoolRow
from tests.unit.bot.cli.builders import NOW, gpubot


def four_gpus(database: Database) -> dict[int, int]:
    """Pool a100 with one node of four GPUs; {index: gpu id}."""
    with database.write() as session:
        # Flush parents first: without relationship()s the ORM does not order inserts by FK.
        session.add(PoolRow(name="a100"))
        session.flush()
        node = NodeRow(name="a100-node-01", pool="a100")
        session.add(node)
        session.flush()
        assert node.id is not None
        gpus = [GpuRow(node_id=node.id, index=i, pool="a100") for i in range(4)]
        session.add_all(gpus)
        session.flush()
        return {g.index: g.id for g in gpus if g.id is not None}


def a_lease(database: Database, gpu_ids: list[int], *, state: str, expires_at: datetime) -> None:
    with database.write() as session:
        lease = LeaseRow(
            holder="U0ALICE01",
            team="vision",
            pool="a100",
            gpus=len(gpu_ids),
            state=state,
            granted_at=NOW,
            expires_at=expires_at,
        )
        session.add(lease)
        session.flush()
        assert lease.id is not None
        active = state == "active"
        session.add_all(LeaseGpuRow(lease_id=lease.id, gpu_id=g, active=active) for g in gpu_ids)


def test_leases_shows_an_active_lease_with_its_gpus_times_and_time_left(
    url: str, database: Database
) -> None:
    """One row: code, holder, team, pool, node:indices, UTC times, time left, state."""
    gpus = four_gpus(database)
    expires = datetime.now(UTC) + timedelta(hours=5, minutes=12, seconds=30)
    a_lease(database, [gpus[0], gpus[1]], state="active", expires_at=expires)
    result = gpubot("leases", "--database-url", url)
    assert 0 == result.exit_code, result.output
    row = next(line for line in result.stdout.splitlines() if "L1" in line)
    cells = [cell.strip() for cell in row.split("│")]
    expected = [
        "L1",
        "U0ALICE01",
        "vision",
        "a100",
        "a100-node-01:0,1",
        "2025-03-14 09:30",
        expires.strftime("%Y-%m-%d %H:%M"),
        "5h 12m",
        "active",
    ]
    assert expected == cells


def test_leases_without_an_active_lease_says_so(url: str, database: Database) -> None:
    """An ended lease is hidden unless --all, which shows it with no time left."""
    gpus = four_gpus(database)
    a_lease(database, [gpus[2]], state="released", expires_at=NOW + timedelta(hours=6))
    active = gpubot("leases", "--database-url", url)
    every = gpubot("leases", "--all", "--database-url", url)
    assert (0, "No active leases.\n") == (active.exit_code, active.stdout)
    assert 0 == every.exit_code, every.output
    row = next(line for line in every.stdout.splitlines() if "L1" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert ("a100-node-01:2", "-", "released") == (cells[4], cells[7], cells[8])


def test_leases_of_an_empty_database_says_no_active_leases(url: str) -> None:
    """A fresh database prints the sentence, not an empty table."""
    result = gpubot("leases", "--database-url", url)
    assert (0, "No active leases.\n") == (result.exit_code, result.stdout)
