"""`choose` for the DCGM and Prometheus modes: the feed, its /healthz note (hybrid with node
agents; processes unknown without), and a friendly refusal when the endpoints are not set."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest

from bot.telemetry.dcgm import DcgmSource
from bot.telemetry.errors import EndpointsError
from bot.telemetry.promapi import PrometheusSource
from bot.telemetry.sources import choose


@pytest.fixture
def endpoints(tmp_path: Path) -> Path:
    path = tmp_path / "dcgm.yaml"
    path.write_text(
        "a100-node-01: http://a100-node-01:9400/metrics\nh100-node-01: http://h100-node-01:9400\n"
    )
    return path


def test_dcgm_with_node_agents_is_hybrid(endpoints: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="bot.telemetry.sources"):
        feed = choose("dcgm", agents=True, dcgm_endpoints=endpoints)
    assert isinstance(feed.source, DcgmSource)
    feed.source.close()
    hybrid = "hybrid: node agents supply the processes and enforcement"
    assert ("dcgm", f"2 DCGM exporters (GPUBOT_DCGM_ENDPOINTS_FILE); {hybrid}") == (
        feed.kind,
        feed.note,
    )
    assert ["http://a100-node-01:9400/metrics", "http://h100-node-01:9400/metrics"] == list(
        feed.source.endpoints.values()
    )
    (record,) = caplog.records
    assert (logging.INFO, f"telemetry: dcgm: {feed.note}") == (record.levelno, record.getMessage())


@pytest.mark.parametrize("kind", ["dcgm", "prometheus"])
def test_without_node_agents_processes_are_unknown_and_the_log_warns(
    endpoints: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """No process owners from DCGM: no unreserved-use detection, said once as a warning."""
    with caplog.at_level(logging.INFO, logger="bot.telemetry.sources"):
        feed = choose(
            kind,  # type: ignore[arg-type]
            agents=False,
            dcgm_endpoints=endpoints,
            prometheus_url="http://prometheus:9090",
        )
    assert feed.source is not None
    feed.source.close()
    assert kind == feed.kind
    assert "processes are unknown, so there is no unreserved-use detection" in feed.note
    (record,) = caplog.records
    assert (logging.WARNING, f"telemetry: {kind}: {feed.note}") == (
        record.levelno,
        record.getMessage(),
    )


def test_prometheus_reads_the_server_and_its_staleness_window() -> None:
    feed = choose(
        "prometheus",
        agents=True,
        prometheus_url="http://prometheus:9090/",
        stale_after=timedelta(minutes=5),
    )
    assert isinstance(feed.source, PrometheusSource)
    assert ("http://prometheus:9090", timedelta(minutes=5)) == (
        feed.source.url,
        feed.source.stale_after,
    )
    assert feed.note.startswith("the DCGM series from Prometheus (GPUBOT_PROMETHEUS_URL); hybrid")
    assert "prometheus:9090" not in feed.note  # /healthz answers anyone: no addresses


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("dcgm", "GPUBOT_TELEMETRY=dcgm needs GPUBOT_DCGM_ENDPOINTS_FILE: a YAML file"),
        ("prometheus", "GPUBOT_TELEMETRY=prometheus needs GPUBOT_PROMETHEUS_URL"),
    ],
)
def test_a_mode_without_its_endpoints_says_what_to_set(kind: str, expected: str) -> None:
    with pytest.raises(EndpointsError, match=expected):
        choose(kind, agents=True)  # type: ignore[arg-type]


def test_a_missing_endpoints_file_names_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(EndpointsError, match=f"GPUBOT_DCGM_ENDPOINTS_FILE={missing}: cannot read"):
        choose("dcgm", agents=False, dcgm_endpoints=missing)
