"""`gpubot rules simulate CANDIDATE_DIR`: the summary and the differences on a recorded history,
JSON lines for scripts, exit 2 with file:line for a broken candidate or a bad --since."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.services import Services
from rules.loader import load_policy
from storage import keyvalue
from storage.db import Database
from tests.builders import default_sources
from tests.unit.bot.cli.builders import edit, gpubot
from tests.unit.bot.conftest import Clock
from tests.unit.bot.history import candidate_dir, candidate_sources, record_history


@pytest.fixture
def url(url_either: str) -> str:
    """The command on a migrated SQLite file, then on a migrated PostgreSQL database."""
    return url_either


@pytest.fixture
def recorded(database: Database) -> Database:
    """The simulation's recorded history (three borrows in March 2026) in a migrated file."""
    clock = Clock()
    services = Services.open(database, default_sources(), engine="reference", clock=clock)
    record_history(services, clock.advance)
    services.close()
    return database


def simulate(url: str, *args: str) -> tuple[int, str, str]:
    result = gpubot("rules", "simulate", *args, "--since", "2026-03-01", "--database-url", url)
    return result.exit_code, result.stdout, result.stderr


def test_simulate_prints_the_summary_then_one_line_per_difference(
    recorded: Database, url: str, tmp_path: Path
) -> None:
    """Exit 0; the known differences; the candidate's failing cases are a warning, since a
    reload would refuse it; the summary is kept for its revision."""
    code, out, err = simulate(url, str(candidate_dir(tmp_path)))
    assert 0 == code, err
    lines = out.splitlines()
    assert lines[0].startswith("Simulated revision ")
    assert [
        "requests replayed: 3",
        "outcomes changed: 2 (approve → ask: 1, approve → deny: 1)",
        "leases replayed: 3",
        "would-have reclaims: 1 added, 0 removed",
        "warnings: 0 added, 0 removed",
        "GPU-h freed: 0.33",
        "people affected: Alice Anders, Carol Chen",
        "differences:",
    ] == lines[1:9]
    assert 4 == len(lines[9:])
    assert lines[-1].startswith("L1 of Alice Anders (2 a100): reclaim idle at 2026-03-02 10:30")
    assert "a reload would refuse this revision" in err
    revision = load_policy(candidate_sources()).revision
    with recorded.read() as session:
        kept = keyvalue.simulation(session, revision)
    assert kept is not None
    assert 2 == json.loads(kept)["changed"]


def test_simulate_writes_json_lines_for_scripts(
    recorded: Database, url: str, tmp_path: Path
) -> None:
    code, out, err = simulate(url, str(candidate_dir(tmp_path)), "--format", "jsonl")
    assert 0 == code, err
    objects = [json.loads(line) for line in out.splitlines()]
    assert ["request", "request", "lease", "lease"] == [o["type"] for o in objects[:-1]]
    assert 0.33 == objects[-1]["summary"]["gpu_h_freed"]


def test_a_broken_candidate_exits_2_naming_the_file_and_line(url: str, tmp_path: Path) -> None:
    """Nothing is simulated on rules that do not load."""
    broken = candidate_dir(tmp_path)
    edit(broken / "requests.yaml", "request.gpus > limits", "request.gpu > limits")
    code, out, err = simulate(url, str(broken))
    assert 2 == code
    assert f"{broken}/requests.yaml:10:11: unknown fact `request.gpu`" in err
    assert "" == out


def test_a_missing_candidate_dir_exits_2(url: str, tmp_path: Path) -> None:
    code, _, err = simulate(url, str(tmp_path / "nowhere"))
    assert (2, f"error: {tmp_path / 'nowhere'}: no such rules directory\n") == (code, err)


@pytest.mark.parametrize(
    ("since", "says"),
    [("yesterday", "--since: expected an ISO date or time"), ("2999-01-01", "is not in the past")],
)
def test_a_bad_since_exits_2_saying_what_it_expected(
    url: str, tmp_path: Path, since: str, says: str
) -> None:
    result = gpubot(
        "rules", "simulate", str(candidate_dir(tmp_path)), "--since", since, "--database-url", url
    )
    assert 2 == result.exit_code
    assert says in result.stderr
