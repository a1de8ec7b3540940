"""The Prometheus source against recorded /api/v1/query answers served on loopback: nodes from
`Hostname` or `instance`, stale samples and missing GPUs unknown, a failing server unknown too."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest

from bot.telemetry.errors import EndpointsError
from bot.telemetry.model import Sample
from bot.telemetry.promapi import STAMPS, VALUES, PrometheusSource, node_of, prometheus_url
from bot.telemetry.window import TelemetryWindow
from tests.unit.telemetry.builders import START, at
from tests.unit.telemetry.loopback import Answer, Recorded, nothing_listening, recorded

JSON = "application/json"


@pytest.fixture
def prometheus() -> Iterator[Recorded]:
    with recorded() as server:
        server.record(f"query:{VALUES}", "prometheus-values.json", content_type=JSON)
        server.record(f"query:{STAMPS}", "prometheus-stamps.json", content_type=JSON)
        yield server


def by_gpu(samples: list[Sample]) -> dict[tuple[str, int], Sample]:
    return {(s.node, s.index): s for s in samples}


def test_the_dcgm_series_come_back_as_samples_on_their_nodes(prometheus: Recorded) -> None:
    """a100-node-01 by its Hostname label, h100-node-02 by its instance; the engine ratio wins
    over GPU_UTIL where both are there; both queries asked once."""
    source = PrometheusSource(prometheus.url())
    gpus = by_gpu(source.poll(START))
    assert [("a100-node-01", 0), ("a100-node-01", 1), ("h100-node-02", 0)] == sorted(gpus)
    busy, h100 = gpus["a100-node-01", 1], gpus["h100-node-02", 0]
    assert (97.0, 61234, 61234 + 18408, "ok", None) == (
        busy.util_pct,
        busy.memory_used_mib,
        busy.memory_total_mib,
        busy.health,
        busy.error,
    )
    assert pytest.approx(1.2) == h100.util_pct
    assert (20480, START) == (h100.memory_used_mib, h100.taken_at)
    assert [f"query:{VALUES}", f"query:{STAMPS}"] == prometheus.asked


def test_a_gpu_whose_newest_sample_is_stale_is_unknown(
    prometheus: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    """h100-node-02 was last scraped ten minutes before: unknown (never idle), the rest fresh;
    one warning for two polls, one line when it is fresh again."""
    prometheus.record(f"query:{STAMPS}", "prometheus-stamps-stale.json", content_type=JSON)
    source = PrometheusSource(prometheus.url(), stale_after=timedelta(minutes=3))
    window = TelemetryWindow(stale_after=timedelta(minutes=3))
    with caplog.at_level(logging.INFO, logger="bot.telemetry"):
        source.poll(START - timedelta(seconds=1))
        window.observe(source.poll(START))
        prometheus.record(f"query:{STAMPS}", "prometheus-stamps.json", content_type=JSON)
        source.poll(START + timedelta(seconds=1))
    assert [
        "telemetry: Prometheus's samples of h100-node-02: its newest sample is from "
        "2025-03-14 08:50:00 UTC; its GPUs are unknown until it answers",
        "telemetry: Prometheus's samples of h100-node-02 are fresh again",
    ] == caplog.messages
    gpus = by_gpu(list(window.latest().values()))
    assert "newest sample is from 2025-03-14 08:50:00 UTC" in str(gpus["h100-node-02", 0].error)
    stale = window.gpu("h100-node-02", 0, START)
    assert (True, timedelta(0), None) == (stale.unknown, stale.idle_for, stale.util_pct)
    assert window.gpu("a100-node-01", 0, START).fresh


def test_a_gpu_missing_from_the_answer_is_unknown(prometheus: Recorded) -> None:
    """A GPU seen before and absent now (its target went down) is unknown, not forgotten."""
    source = PrometheusSource(prometheus.url())
    source.poll(START)
    prometheus.answers[f"query:{VALUES}"] = Answer(
        '{"status":"success","data":{"resultType":"vector","result":[]}}'
    )
    gpus = by_gpu(source.poll(at(0.5)))
    assert 3 == len(gpus)
    assert all("missing from Prometheus's answer" in str(s.error) for s in gpus.values())


@pytest.mark.parametrize("failure", ["refused query", "unreachable"])
def test_prometheus_failing_leaves_every_gpu_unknown_with_one_warning(
    prometheus: Recorded, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    """Its own error message (bad_data: ...) or the connection's, once in the log for two polls."""
    source = PrometheusSource(prometheus.url())
    source.poll(START)
    if failure == "refused query":
        prometheus.record(f"query:{VALUES}", "prometheus-error.json", status=400, content_type=JSON)
        expected = 'HTTP 400 Bad Request: {"status": "error", "errorType": "bad_data"'
    else:
        source.url = nothing_listening().removesuffix("/metrics")
        expected = "unreachable"
    with caplog.at_level(logging.WARNING, logger="bot.telemetry"):
        first = source.poll(at(0.5))
        source.poll(at(1))
    assert 3 == len(first)
    assert all(expected in str(s.error) for s in first)
    (line,) = caplog.messages
    assert line.startswith(f"telemetry: Prometheus at {source.url}: ")
    assert 1 == line.count(source.url)


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"Hostname": "a100-node-01.lab.example", "instance": "10.0.4.11:9400"}, "a100-node-01"),
        ({"instance": "h100-node-02.lab.example:9400"}, "h100-node-02"),
        ({"instance": "10.0.4.11:9400"}, "10.0.4.11"),
        ({"instance": "[fd00::11]:9400"}, "fd00::11"),
        ({"job": "dcgm-exporter"}, None),
    ],
)
def test_a_series_is_placed_on_its_node(labels: dict[str, str], node: str | None) -> None:
    assert node == node_of(labels)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (None, "needs GPUBOT_PROMETHEUS_URL"),
        ("prometheus:9090", "is not the server's base URL"),
        ("http://prometheus:9090/api/v1/query?query=up", "a query is not"),
    ],
)
def test_a_missing_or_wrong_prometheus_url_says_what_to_set(url: str | None, expected: str) -> None:
    with pytest.raises(EndpointsError, match=expected):
        prometheus_url(url)


def test_a_prometheus_url_keeps_its_path_prefix() -> None:
    assert "http://mon.lab.example/prometheus" == prometheus_url(
        "http://mon.lab.example/prometheus/"
    )
