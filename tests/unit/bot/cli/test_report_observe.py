"""`gpubot report observe`: the observe-only rules over a scripted timeline of real sweeps,
read by the command line from a SQLite file and from PostgreSQL, with the rules in
GPUBOT_RULES_DIR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from freezegun import freeze_time

from bot.services import Services
from storage.db import Database
from tests.unit.bot.cli.builders import a_copy_of_the_rules, gpubot
from tests.unit.bot.conftest import T0, Clock
from tests.unit.bot.observing import OBSERVED_RULE, observing_sources, three_idle_leases


@pytest.fixture
def url(url_either: str) -> str:
    """The command on a migrated SQLite file, then on a migrated PostgreSQL database."""
    return url_either


@pytest.fixture
def observed_timeline(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The timeline from 09:00 to 10:35 on 2 March 2026, the rules with the observe-only rule."""
    rules = a_copy_of_the_rules(tmp_path)
    with (rules / "sweep.yaml").open("a", encoding="utf-8") as sweep:
        sweep.write(OBSERVED_RULE)
    monkeypatch.setenv("GPUBOT_RULES_DIR", str(rules))
    monkeypatch.setenv("TZ", "UTC")
    database = Database(url)
    clock = Clock(T0)
    services = Services.open(database, observing_sources(), clock=clock)
    try:
        three_idle_leases(services, clock)
    finally:
        services.close()
        database.dispose()
    return url


def observe(url: str, *args: str) -> tuple[int, str, str]:
    with freeze_time("2026-03-02 12:00:00"):
        result = gpubot("report", "observe", "--since", "24h", *args, "--database-url", url)
    return result.exit_code, result.stdout, result.stderr


def test_report_observe_prints_each_observed_rule_and_its_false_positive_rate(
    observed_timeline: str,
) -> None:
    code, out, err = observe(observed_timeline)
    assert (0, "") == (code, err)
    assert [
        "Observe-only rules from 2026-03-01 12:00 UTC to 2026-03-02 12:00 UTC",
        "big-request-without-reason (request rule, observe mode)",
        "  would have done nothing in this window",
        "reclaim-idle-fast (lease rule, observe mode)",
        "  would have done: reclaim idle 3 times, to 3 leases",
        "  busy again within 1h after 1 of 2 would-have reclaims (50 %); 1 left out: no "
        "telemetry for part of the 1h after",
    ] == out.splitlines()


def test_report_observe_as_json_lines_is_one_object_per_rule(observed_timeline: str) -> None:
    code, out, _ = observe(observed_timeline, "--format", "jsonl")
    assert 0 == code
    objects = {o["rule"]: o for o in map(json.loads, out.splitlines())}
    assert {"big-request-without-reason", "reclaim-idle-fast"} == set(objects)
    fast = objects["reclaim-idle-fast"]
    assert ({"reclaim idle": 3}, 3) == (fast["would_have"], fast["affected"])
    assert {
        "busy_again": 1,
        "not_busy_again": 1,
        "unknown": 1,
        "too_recent": 0,
        "false_positive_rate": 0.5,
        "busy_again_within": "1h",
    } == fast["reclaims"]


def test_report_observe_with_a_bad_window_exits_2(url: str) -> None:
    result = gpubot("report", "observe", "--since", "soon", "--database-url", url)
    assert 2 == result.exit_code
    assert result.stderr.startswith("error: --since: I could not read `soon`")
