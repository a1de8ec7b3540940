"""`gpubot nodes --history`: its table names people and shows times in one zone; csv keeps
Slack ids and UTC for programs."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest

from storage.db import Database
from tests.unit.bot.cli.builders import NOW, gpubot
from tests.unit.bot.cli.test_leases import a_lease, four_gpus


@pytest.fixture
def leased(database: Database) -> None:
    """Alice holds GPU 1 of a100-node-01 from 09:30 UTC on 14 March 2025."""
    gpus = four_gpus(database)
    a_lease(database, [gpus[1]], state="active", expires_at=NOW + timedelta(days=9))


@pytest.mark.usefixtures("leased")
def test_the_history_table_names_the_holder_and_shows_times_in_the_zone_asked_for(
    url: str,
) -> None:
    """--tz Asia/Tokyo: the lease's interval starts at 18:30, by Alice Anders; the header
    names the zone."""
    result = gpubot("nodes", "--history", "--tz", "Asia/Tokyo", "--database-url", url)
    assert 0 == result.exit_code, result.output
    lines = result.stdout.splitlines()
    header = [cell.strip() for cell in lines[0].split("┃")]
    assert ["start (Asia/Tokyo)", "end (Asia/Tokyo)", "by"] == header[6:9]
    row = next(line for line in lines if "leased" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert ["a100-node-01", "1", "leased", "L1", "2025-03-14 18:30", "", "Alice Anders"] == [
        cells[0],
        cells[1],
        cells[3],
        cells[5],
        cells[6],
        cells[7],
        cells[8],
    ]


@pytest.mark.usefixtures("leased")
def test_the_history_as_csv_keeps_slack_ids_and_utc(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the machine's zone, csv carries the id and the UTC time."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    result = gpubot("nodes", "--history", "--format", "csv", "--database-url", url)
    assert 0 == result.exit_code, result.output
    rows = [r for r in csv.DictReader(io.StringIO(result.stdout)) if r["state"] == "leased"]
    assert [("U0ALICE01", "2025-03-14T09:30:00+00:00")] == [(r["by"], r["start"]) for r in rows]
