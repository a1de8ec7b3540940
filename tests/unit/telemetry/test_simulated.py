"""The simulated fleet: fixture files replayed at chosen times, faults as real NVML faults,
fleet files refused with file:line:col, and how a source is chosen."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Literal

import pytest
import yaml

from bot.telemetry.errors import FleetError
from bot.telemetry.fleet_file import load_fleet, parse_fleet
from bot.telemetry.model import Sample
from bot.telemetry.nvml import NvmlSource
from bot.telemetry.simulated import SimulatedSource, simulated_uuid
from bot.telemetry.sources import DEFAULT_FLEET, choose, make_source
from tests.unit.telemetry.builders import FLEETS, ROOT, START, at


def replay(
    name: str | Path, minutes: float, node: str | None = None
) -> dict[tuple[str, int], Sample]:
    """Samples of fixtures/fleets/NAME (or the fleet at a path) `minutes` into the replay."""
    source = SimulatedSource(load_fleet(FLEETS / name), START, node=node)
    return {(s.node, s.index): s for s in source.poll(at(minutes))}


@pytest.mark.parametrize(
    "path", [*sorted(FLEETS.glob("*.yaml")), DEFAULT_FLEET], ids=lambda p: p.name
)
def test_every_fleet_fixture_loads_and_replays(path: Path) -> None:
    fleet = load_fleet(path)
    samples = SimulatedSource(fleet, START).poll(at(1))
    assert sum(node.gpus for node in fleet.nodes.values()) == len(samples)


def test_the_default_fleet_is_the_fleet_of_the_pool_rules() -> None:
    """Same node names, GPU counts and models as pools.yaml; every user has a Slack account."""
    pools = yaml.safe_load((ROOT / "rules/policies/pools.yaml").read_text())["pools"]
    accounts = yaml.safe_load((ROOT / "rules/policies/org.yaml").read_text())["accounts"]
    expected = {
        node: (count, pool["model"])
        for pool in pools.values()
        for node, count in pool["nodes"].items()
    }
    fleet = load_fleet(DEFAULT_FLEET)
    assert expected == {name: (n.gpus, n.model) for name, n in fleet.nodes.items()}
    users = {
        p.user
        for node in fleet.nodes.values()
        for segments in node.timelines.values()
        for segment in segments
        for p in segment.processes
    }
    assert users <= set(accounts)


def test_a_timeline_is_replayed_segment_by_segment() -> None:
    """a100-node.yaml GPU 2: a notebook computes for 30 minutes, then holds its memory."""
    early = replay("a100-node.yaml", 5)[("a100-node-01", 2)]
    late = replay("a100-node.yaml", 31)[("a100-node-01", 2)]
    assert (63.0, 38400) == (early.util_pct, early.memory_used_mib)
    assert (0.0, 38400, "bob") == (late.util_pct, late.memory_used_mib, late.processes[0].user)


def test_a_finished_job_leaves_the_gpu_empty_and_an_untouched_gpu_is_idle() -> None:
    samples = replay("a100-node.yaml", 11)
    assert (0.0, 0, ()) == tuple(
        getattr(samples[("a100-node-01", 3)], f)
        for f in ("util_pct", "memory_used_mib", "processes")
    )
    assert (0.0, ()) == (
        samples[("a100-node-01", 7)].util_pct,
        samples[("a100-node-01", 7)].processes,
    )


def test_process_start_times_come_from_the_fleet() -> None:
    """`started: -3h` is three hours before the replay began (the PID-reuse guard reads it)."""
    (proc,) = replay("a100-node.yaml", 1)[("a100-node-01", 0)].processes
    assert (START - timedelta(hours=3)).timestamp() == proc.started


@pytest.mark.parametrize(
    ("minutes", "index", "health", "error"),
    [
        (44, 3, "ok", None),
        (46, 3, "lost", "NVMLError_GpuIsLost: GPU is lost"),
        (29, 5, "ok", None),
        (31, 5, "xid", None),
        (21, 6, "ok", None),  # Xid 13 is the application's fault, not the GPU's
        (61, 2, "ok", "NVMLError_Unknown: Unknown Error"),
        (63, 2, "ok", None),
        (91, 7, "ecc", None),
    ],
)
def test_the_failing_fleet_fails_as_real_gpus_do(
    minutes: float, index: int, health: str, error: str | None
) -> None:
    # One source replayed up to `minutes`, as a running agent would be: Xids arrive as events.
    source = SimulatedSource(load_fleet(FLEETS / "failing-gpu.yaml"), START)
    for minute in range(0, int(minutes) + 1, 5):
        source.poll(at(minute))
    sample = {s.index: s for s in source.poll(at(minutes))}[index]
    assert (health, error) == (sample.health, sample.error)


def test_one_node_of_a_fleet_is_what_one_agent_sees() -> None:
    samples = replay(DEFAULT_FLEET, 1, node="l40s-node-02")
    assert {("l40s-node-02", i) for i in range(4)} == set(samples)


def test_a_node_missing_from_the_fleet_is_refused_naming_the_ones_it_has() -> None:
    with pytest.raises(ValueError, match=r"'gpu-9' is not in the fleet .*a100-node-01"):
        SimulatedSource(load_fleet(FLEETS / "a100-node.yaml"), START, node="gpu-9")


def test_simulated_uuids_are_stable_and_distinct() -> None:
    first = replay("a100-node.yaml", 1)
    again = replay("a100-node.yaml", 50)
    assert [s.uuid for s in first.values()] == [s.uuid for s in again.values()]
    assert 8 == len({s.uuid for s in first.values()})
    assert simulated_uuid("a100-node-01", 0) == first[("a100-node-01", 0)].uuid


GOOD = """\
nodes:
  n1:
    model: NVIDIA L40S
    memory_mib: 46068
    gpus: 2
"""


@pytest.mark.parametrize(
    ("tail", "where", "words"),
    [
        (
            "    timelines: {0: [{from: 0m, util: 150}]}\n",
            "fleet.yaml:6:",
            "less than or equal to 100",
        ),
        (
            "    faults: [{gpu: 0, at: 1m, error: GpuOnFire}]\n",
            "fleet.yaml:6:",
            "NVMLError_GpuOnFire",
        ),
        ("    faults: [{gpu: 0, at: 1m}]\n", "fleet.yaml:6:", "exactly one of error, xid or ecc"),
        ("    colour: green\n", "fleet.yaml:6:", "unknown key 'colour'"),
        ("    timelines: {5: [{from: 0m}]}\n", "fleet.yaml:6:", "the node has 2 GPUs"),
        ("    timelines: {0: [{from: soon}]}\n", "fleet.yaml:6:", "expected a duration"),
        ("    unsupported: [nvmlDeviceGetFanSpeed]\n", "fleet.yaml:6:", "nvmlDeviceGetFanSpeed"),
        ("    faults: [\n", "fleet.yaml:7:", "YAML"),
    ],
)
def test_a_malformed_fleet_is_refused_with_file_and_line(tail: str, where: str, words: str) -> None:
    with pytest.raises(FleetError) as caught:
        parse_fleet(GOOD + tail, "fleet.yaml")
    assert str(caught.value).startswith(where)
    assert words in str(caught.value)


def test_a_missing_fleet_file_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match=r"nope\.yaml: cannot read the fleet file: No such file"):
        load_fleet(tmp_path / "nope.yaml")


def test_the_simulated_kind_replays_the_default_fleet_from_the_start_given() -> None:
    source = make_source("simulated", start=START)
    assert isinstance(source, SimulatedSource)
    assert 28 == len(source.poll(at(1)))


def test_the_nvml_kind_reads_this_host_under_the_name_given() -> None:
    source = make_source("nvml", node_name="a100-node-01")
    assert isinstance(source, NvmlSource)
    assert "a100-node-01" == source.node


def test_the_demo_fleet_is_package_data_not_a_test_fixture() -> None:
    """The demo's fleet ships inside the package; fixtures/ holds only the tests' fleets."""
    assert Path("bot/telemetry/fleets/default.yaml") == DEFAULT_FLEET.relative_to(ROOT)
    assert not (FLEETS / DEFAULT_FLEET.name).exists()


def test_auto_reads_nvml_when_it_finds_gpus() -> None:
    feed = choose("auto", agents=False, node_name="a100-node-01", found=lambda: True)
    assert "nvml" == feed.kind
    assert isinstance(feed.source, NvmlSource)
    assert "a100-node-01" == feed.source.node


def test_auto_without_nvml_is_node_agents_when_they_are_configured() -> None:
    feed = choose("auto", agents=True, found=lambda: False)
    assert ("agents", None) == (feed.kind, feed.source)


@pytest.mark.parametrize("kind", ["auto", "agents"])
def test_no_gpu_and_no_agents_is_no_telemetry_never_the_simulated_fleet(
    kind: Literal["auto", "agents"],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without NVML and node agents the bot reads nothing, says so in one line, and never
    builds the simulated fleet."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the simulated fleet was built")

    monkeypatch.setattr("bot.telemetry.sources.load_fleet", refuse)
    monkeypatch.setattr("bot.telemetry.sources.nvml_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="bot.telemetry.sources"):
        feed = choose(kind, agents=False, fleet_path=FLEETS / "a100-node.yaml")
    assert ("none", None) == (feed.kind, feed.source)
    assert "nothing is reclaimed for idleness" in feed.note
    (line,) = caplog.messages
    assert line.startswith("telemetry: none: ")


def test_the_simulated_fleet_is_chosen_only_by_name() -> None:
    feed = choose("simulated", agents=False, fleet_path=FLEETS / "a100-node.yaml", start=START)
    assert "simulated" == feed.kind
    assert isinstance(feed.source, SimulatedSource)
    assert ["a100-node-01"] == list(feed.source.nodes)
