"""`gpubot leases`: the active leases as a table, people by name, times in one zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bot.cli.display import local_zone
from storage.db import Database
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, PoolRow
from tests.unit.bot.cli.builders import NOW, a_copy_of_the_rules, edit, gpubot


@pytest.fixture(autouse=True)
def _utc_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's zone is UTC unless a test says otherwise."""
    monkeypatch.setenv("TZ", "UTC")


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


def a_lease(
    database: Database,
    gpu_ids: list[int],
    *,
    state: str,
    expires_at: datetime,
    holder: str = "U0ALICE01",
) -> None:
    with database.write() as session:
        lease = LeaseRow(
            holder=holder,
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
    """One row: code, holder's name, team, pool, node:indices, times, time left, state."""
    gpus = four_gpus(database)
    expires = datetime.now(UTC) + timedelta(hours=5, minutes=12, seconds=30)
    a_lease(database, [gpus[0], gpus[1]], state="active", expires_at=expires)
    result = gpubot("leases", "--database-url", url)
    assert 0 == result.exit_code, result.output
    row = next(line for line in result.stdout.splitlines() if "L1" in line)
    cells = [cell.strip() for cell in row.split("│")]
    expected = [
        "L1",
        "Alice Anders",
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


def cells_of(output: str, code: str = "L1") -> list[str]:
    row = next(line for line in output.splitlines() if line.startswith(code))
    return [cell.strip() for cell in row.split("│")]


def header_of(output: str) -> list[str]:
    return [cell.strip() for cell in output.splitlines()[0].split("┃")]


def test_leases_show_times_in_the_zone_asked_for_and_name_it_in_the_header(
    url: str, database: Database
) -> None:
    """--tz America/New_York: 09:30 UTC is 05:30 (EDT on 14 March 2025), said in the header."""
    gpus = four_gpus(database)
    a_lease(database, [gpus[0]], state="active", expires_at=NOW + timedelta(hours=6))
    result = gpubot("leases", "--all", "--tz", "America/New_York", "--database-url", url)
    assert 0 == result.exit_code, result.output
    header = header_of(result.stdout)
    assert ["granted (America/New_York)", "expires (America/New_York)"] == header[5:7]
    assert ["2025-03-14 05:30", "2025-03-14 11:30"] == cells_of(result.stdout)[5:7]


def test_leases_show_times_in_the_machines_zone_by_default(
    url: str, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no --tz, the machine's zone ($TZ here): 09:30 UTC is 18:30 in Tokyo."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    gpus = four_gpus(database)
    a_lease(database, [gpus[0]], state="released", expires_at=NOW + timedelta(hours=1))
    result = gpubot("leases", "--all", "--database-url", url)
    assert 0 == result.exit_code, result.output
    assert "granted (Asia/Tokyo)" == header_of(result.stdout)[5]
    assert ["2025-03-14 18:30", "2025-03-14 19:30"] == cells_of(result.stdout)[5:7]


def test_leases_with_an_unknown_zone_say_what_they_expected(url: str) -> None:
    """A zone no one knows: exit 2 and one line."""
    result = gpubot("leases", "--tz", "Mars/Olympus", "--database-url", url)
    assert 2 == result.exit_code
    assert result.stderr == (
        "error: --tz: unknown time zone 'Mars/Olympus'; expected a name like Europe/Berlin, UTC\n"
    )


def test_leases_name_holders_from_the_rules_in_force_else_show_the_id(
    url: str, database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUBOT_RULES_DIR's org.yaml names the holder; someone it does not name keeps the id."""
    rules = a_copy_of_the_rules(tmp_path)
    edit(rules / "org.yaml", "U0ALICE01: Alice Anders", "U0ALICE01: Alice A. (vision)")
    monkeypatch.setenv("GPUBOT_RULES_DIR", str(rules))
    gpus = four_gpus(database)
    a_lease(database, [gpus[0]], state="active", expires_at=NOW + timedelta(days=9))
    a_lease(database, [gpus[1]], state="active", expires_at=NOW + timedelta(days=9), holder="U0NEW")
    result = gpubot("leases", "--database-url", url)
    assert 0 == result.exit_code, result.output
    assert "Alice A. (vision)" == cells_of(result.stdout, "L1")[1]
    assert "U0NEW" == cells_of(result.stdout, "L2")[1]


def test_leases_with_unreadable_rules_show_ids_and_say_why_on_stderr(
    url: str, database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rules that do not load: the table still comes, by id, with a one-line note; exit 0."""
    monkeypatch.setenv("GPUBOT_RULES_DIR", str(tmp_path / "nowhere"))
    gpus = four_gpus(database)
    a_lease(database, [gpus[0]], state="active", expires_at=NOW + timedelta(days=9))
    result = gpubot("leases", "--database-url", url)
    assert 0 == result.exit_code, result.output
    assert "U0ALICE01" == cells_of(result.stdout)[1]
    assert result.stderr.startswith(f"note: people shown by Slack id: {tmp_path / 'nowhere'}: ")
    assert 1 == len(result.stderr.splitlines())


def test_the_machines_zone_is_where_etc_localtime_points_without_tz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No $TZ: the zone /etc/localtime links to, by its name."""
    monkeypatch.delenv("TZ")
    link = tmp_path / "localtime"
    link.symlink_to("/usr/share/zoneinfo/Europe/Berlin")
    zone = local_zone(link)
    assert ("Europe/Berlin", ZoneInfo("Europe/Berlin")) == (zone.name, zone.tz)


def test_the_machines_zone_without_a_name_is_its_offset_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No $TZ and no link to a named zone: the local offset, named as the system names it."""
    monkeypatch.delenv("TZ")
    zone = local_zone(tmp_path / "missing")
    now = datetime.now(UTC)
    assert now.astimezone().utcoffset() == now.astimezone(zone.tz).utcoffset()
    assert zone.name
