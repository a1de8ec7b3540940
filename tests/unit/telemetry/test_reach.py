"""How much of the fleet the DCGM and Prometheus sources read, against recorded answers served on
loopback, and the /healthz words made of it: one failing node degrades, nothing answering is not
ok."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bot.telemetry.dcgm import DcgmSource
from bot.telemetry.promapi import STAMPS, VALUES, PrometheusSource
from bot.telemetry.reach import NAMED, Reach, health_fields
from tests.unit.telemetry.builders import START, at
from tests.unit.telemetry.loopback import Answer, Recorded, nothing_listening, recorded

A100, H100 = "a100-node-01", "h100-node-01"
JSON = "application/json"
FIXTURES = Path(__file__).parents[3] / "fixtures" / "dcgm"


@pytest.fixture
def exporter() -> Iterator[Recorded]:
    with recorded() as server:
        server.record("/metrics", "a100-node-01.prom")
        yield server


@pytest.fixture
def prometheus() -> Iterator[Recorded]:
    with recorded() as server:
        server.record(f"query:{VALUES}", "prometheus-values.json", content_type=JSON)
        server.record(f"query:{STAMPS}", "prometheus-stamps.json", content_type=JSON)
        yield server


def test_one_dead_exporter_is_named_and_the_rest_of_the_fleet_is_read(
    exporter: Recorded,
) -> None:
    """Before any poll nothing fails; then the dead node is named, not the whole source."""
    source = DcgmSource({A100: exporter.url("/metrics"), H100: nothing_listening()})
    try:
        before = source.reach()
        source.poll(START)
        one_down = source.reach()
        source.endpoints[H100] = exporter.url("/metrics")
        source.poll(at(0.5))
        back = source.reach()
    finally:
        source.close()
    assert Reach() == before
    assert ((H100,), False) == (one_down.failing, one_down.whole)
    assert Reach() == back


def test_every_exporter_dead_is_the_whole_source_failing(exporter: Recorded) -> None:
    source = DcgmSource({A100: nothing_listening(), H100: nothing_listening()})
    try:
        source.poll(START)
        got = source.reach()
    finally:
        source.close()
    assert ({A100, H100}, True, "no DCGM exporter answers") == (
        set(got.failing),
        got.whole,
        got.why,
    )


def test_a_stale_or_missing_node_in_prometheus_is_named(prometheus: Recorded) -> None:
    """h100-node-02's newest sample is ten minutes old: it alone fails. Then the answer leaves
    every GPU out: every node fails, and that is the whole source."""
    prometheus.record(f"query:{STAMPS}", "prometheus-stamps-stale.json", content_type=JSON)
    source = PrometheusSource(prometheus.url(), stale_after=timedelta(minutes=3))
    source.poll(START)
    stale = source.reach()
    prometheus.record(f"query:{STAMPS}", "prometheus-stamps.json", content_type=JSON)
    source.poll(at(0.5))
    fresh = source.reach()
    prometheus.answers[f"query:{VALUES}"] = Answer(
        '{"status":"success","data":{"resultType":"vector","result":[]}}'
    )
    source.poll(at(1))
    gone = source.reach()
    assert (("h100-node-02",), False) == (stale.failing, stale.whole)
    assert Reach() == fresh
    assert (("a100-node-01", "h100-node-02"), True) == (gone.failing, gone.whole)


def test_one_gpu_left_out_of_prometheus_answer_is_not_its_node_failing(
    prometheus: Recorded,
) -> None:
    """a100-node-01's GPU 1 drops out of the answer while its GPU 0 is read: that GPU's
    samples are unknown, but the node still reports, and the source is not down."""
    source = PrometheusSource(prometheus.url(), stale_after=timedelta(minutes=3))
    source.poll(START)
    answer = json.loads((FIXTURES / "prometheus-values.json").read_text())
    answer["data"]["result"] = [
        row
        for row in answer["data"]["result"]
        if (row["metric"].get("Hostname"), row["metric"].get("gpu")) != (A100, "1")
    ]
    prometheus.answers[f"query:{VALUES}"] = Answer(json.dumps(answer))
    samples = source.poll(at(0.5))
    left_out = source.reach()
    assert [s.index for s in samples if s.node == A100 and s.error is not None] == [1]
    assert Reach() == left_out


def test_prometheus_not_answering_fails_every_node_it_answered_for(
    prometheus: Recorded,
) -> None:
    source = PrometheusSource(prometheus.url())
    source.poll(START)
    source.url = nothing_listening().removesuffix("/metrics")
    source.poll(at(0.5))
    got = source.reach()
    assert (("a100-node-01", "h100-node-02"), True) == (got.failing, got.whole)
    assert "does not answer" in got.why


@pytest.mark.parametrize(
    ("reach", "problem", "expected"),
    [
        (None, "", (True, False, [], 0, "the note")),
        (Reach(), "", (True, False, [], 0, "the note")),
        (Reach(("n2", "n1")), "", (True, True, ["n1", "n2"], 2, "the note")),
        (
            Reach(("n1", "n2"), True, "none answers"),
            "",
            (False, False, ["n1", "n2"], 2, "none answers"),
        ),
        (None, "NVML is not available", (False, False, [], 0, "NVML is not available")),
    ],
)
def test_healthz_is_degraded_by_some_nodes_and_not_ok_only_when_nothing_is_read(
    reach: Reach | None, problem: str, expected: tuple[object, ...]
) -> None:
    got = health_fields(reach, problem, "the note")
    assert expected == (
        got["telemetry_ok"],
        got["telemetry_degraded"],
        got["telemetry_failing_nodes"],
        got["telemetry_failing_count"],
        got["telemetry_note"],
    )


def test_a_large_outage_names_a_few_nodes_and_counts_them_all() -> None:
    failing = tuple(f"node-{k:04d}" for k in range(300))
    got = health_fields(Reach(failing), "", "")
    assert (NAMED, 300, "node-0000") == (
        len(got["telemetry_failing_nodes"]),
        got["telemetry_failing_count"],
        got["telemetry_failing_nodes"][0],
    )
