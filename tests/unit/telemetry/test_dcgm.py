"""The DCGM source against recorded dcgm-exporter output served on loopback: the series read,
MIG folded into whole GPUs, Xids and row remaps as health, and a node that cannot be read left
unknown (never idle) with one log line per change."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.telemetry.dcgm import (
    SERIES,
    UTIL,
    DcgmSource,
    load_endpoints,
    read_exposition,
    samples_from_series,
)
from bot.telemetry.errors import EndpointsError
from bot.telemetry.model import Sample
from bot.telemetry.window import TelemetryWindow
from tests.unit.telemetry.builders import START, at
from tests.unit.telemetry.loopback import DCGM, Answer, Recorded, nothing_listening, recorded

A100 = "a100-node-01"
H100 = "h100-node-01"


@pytest.fixture
def exporter() -> Iterator[Recorded]:
    with recorded() as server:
        server.record("/metrics", "a100-node-01.prom")
        yield server


def by_index(samples: list[Sample]) -> dict[int, Sample]:
    return {s.index: s for s in samples}


def poll_once(url: str, node: str = A100) -> list[Sample]:
    source = DcgmSource({node: url})
    try:
        return source.poll(START)
    finally:
        source.close()


def test_each_gpu_of_an_exporter_becomes_one_sample(exporter: Recorded) -> None:
    """Utilisation, framebuffer, temperature, power, identity and driver, per `gpu` label."""
    gpus = by_index(poll_once(exporter.url("/metrics")))
    assert [0, 1, 2, 3] == sorted(gpus)
    busy = gpus[1]
    assert (A100, 97.0, 61234, 61234 + 18408) == (
        busy.node,
        busy.util_pct,
        busy.memory_used_mib,
        busy.memory_total_mib,
    )
    assert (71.0, 389.5, "ok", START, None) == (
        busy.temperature_c,
        busy.power_w,
        busy.health,
        busy.taken_at,
        busy.error,
    )
    assert ("GPU-9d2e7b41-0c3a-4f6e-8b15-2a9c6d4e1f21", "NVIDIA A100-SXM4-80GB", "550.54.15") == (
        busy.uuid,
        busy.model,
        busy.driver,
    )
    assert all(not s.processes and not s.processes_known for s in gpus.values())


def test_an_applications_own_xid_leaves_the_gpu_healthy(exporter: Recorded) -> None:
    """GPU 3 reports Xid 13 (an application's fault): still ok."""
    assert "ok" == by_index(poll_once(exporter.url("/metrics")))[3].health


def test_a_critical_xid_and_a_failed_row_remap_make_gpus_unhealthy(exporter: Recorded) -> None:
    """The second recording: Xid 79 on GPU 1 is "xid", a failed row remap on GPU 2 is "ecc", and
    the sweep's reading says unhealthy from the next poll on."""
    source = DcgmSource({A100: exporter.url("/metrics")})
    window = TelemetryWindow(stale_after=timedelta(minutes=3))
    try:
        window.observe(source.poll(at(0)))
        before = {i: window.gpu(A100, i, at(0)).healthy for i in range(4)}
        exporter.record("/metrics", "a100-node-01-xid.prom")
        after = by_index(source.poll(at(0.5)))
        window.observe(list(after.values()))
    finally:
        source.close()
    assert {0: True, 1: True, 2: True, 3: True} == before
    assert ["ok", "xid", "ecc", "ok"] == [after[i].health for i in range(4)]
    readings = [window.gpu(A100, i, at(0.5)) for i in range(4)]
    assert [True, False, False, True] == [r.healthy for r in readings]
    assert ("xid", "ecc") == (readings[1].health, readings[2].health)


def test_mig_instances_fold_into_their_physical_gpu() -> None:
    """GPU 0 in MIG mode: busy as its busiest instance (engine ratio x 100), its memory the sum
    of its instances', temperature and power from its own rows. GPU 1 whole: reserved memory
    counts in the total, and the engine ratio wins over GPU_UTIL."""
    with recorded() as server:
        server.record("/metrics", "h100-node-01-mig.prom")
        gpus = by_index(poll_once(server.url("/metrics"), H100))
    mig, whole = gpus[0], gpus[1]
    assert [0, 1] == sorted(gpus)
    assert pytest.approx(81.23) == mig.util_pct
    assert (30211 + 0 + 1180, 30211 + 10241 + 19968 + 1180 + 8748) == (
        mig.memory_used_mib,
        mig.memory_total_mib,
    )
    assert (58.0, 412.311, "ok", None) == (mig.temperature_c, mig.power_w, mig.health, mig.error)
    assert "GPU-7e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a54" == mig.uuid
    assert (0.0, 1, 1 + 80398 + 696) == (
        whole.util_pct,
        whole.memory_used_mib,
        whole.memory_total_mib,
    )


def test_an_unreachable_exporter_leaves_its_gpus_unknown_never_idle(
    exporter: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    """After a good scrape, a node that refuses connections: samples with `error`, the reading
    unknown with no idle time, one warning for three failing polls, one line when it is back."""
    good, dead = exporter.url("/metrics"), nothing_listening()
    source = DcgmSource({A100: good})
    window = TelemetryWindow(stale_after=timedelta(minutes=3))
    try:
        window.observe(source.poll(at(0)))
        source.endpoints[A100] = dead
        with caplog.at_level(logging.INFO, logger="bot.telemetry"):
            failed = [source.poll(at(0.5 * k)) for k in (1, 2, 3)]
            window.observe(failed[-1])
            source.endpoints[A100] = good
            back = source.poll(at(2))
    finally:
        source.close()
    assert all(len(samples) == 4 for samples in failed)
    assert all(s.error and s.util_pct is None for samples in failed for s in samples)
    assert "refused" in str(failed[0][0].error).lower()
    reading = window.gpu(A100, 0, at(1.5))
    assert (True, timedelta(0), None) == (reading.unknown, reading.idle_for, reading.util_pct)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert 1 == len(warnings)
    assert warnings[0].startswith(f"telemetry: DCGM exporter of {A100}: {dead}: unreachable")
    assert any("answers again" in m for m in caplog.messages)
    assert all(s.error is None for s in back)


def test_a_slow_exporter_is_cut_off_at_its_timeout_and_spares_the_others(
    exporter: Recorded,
) -> None:
    """One node that stops answering within the timeout is unknown; the other is read."""
    with recorded() as slow:
        slow.record("/metrics", "h100-node-01-mig.prom")
        source = DcgmSource(
            {A100: exporter.url("/metrics"), H100: slow.url("/metrics")}, timeout_s=0.3
        )
        try:
            source.poll(at(0))
            slow.record("/metrics", "h100-node-01-mig.prom", hold_s=10)
            samples = source.poll(at(0.5))
        finally:
            source.close()
    fast = [s for s in samples if s.node == A100]
    late = [s for s in samples if s.node == H100]
    assert 4 == len(fast)
    assert all(s.error is None for s in fast)
    assert [0, 1] == [s.index for s in late]
    assert all("no answer within 0.3 s" in str(s.error) for s in late)


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ("<html><body>Bad Gateway</body></html>\n", 200, "not Prometheus text exposition"),
        ("upstream connect error\n", 503, "HTTP 503"),
        ("# HELP up Whether the target is up.\n# TYPE up gauge\nup 1\n", 200, "exports no GPU"),
    ],
)
def test_an_answer_that_is_not_dcgm_output_is_one_warning_not_a_traceback(
    exporter: Recorded,
    caplog: pytest.LogCaptureFixture,
    body: str,
    status: int,
    expected: str,
) -> None:
    source = DcgmSource({A100: exporter.url("/metrics")})
    try:
        source.poll(at(0))
        exporter.answers["/metrics"] = Answer(body, status)
        with caplog.at_level(logging.WARNING, logger="bot.telemetry"):
            samples = source.poll(at(0.5))
    finally:
        source.close()
    assert 4 == len(samples)
    assert all(expected in str(s.error) for s in samples)
    (line,) = caplog.messages
    assert expected in line


ODD = """# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",modelName="say \\"hi\\" {}",} 7 1741942800000
DCGM_FI_DEV_GPU_UTIL   {gpu="1",UUID="GPU-2"}   +Inf
DCGM_FI_DEV_FB_USED 12
"""


@pytest.mark.parametrize(
    "text",
    [
        *(
            pytest.param((DCGM / name).read_text(), id=name)
            for name in ("a100-node-01.prom", "a100-node-01-xid.prom", "h100-node-01-mig.prom")
        ),
        pytest.param(ODD, id="odd spacing, escapes, braces and timestamps"),
    ],
)
def test_the_series_read_are_those_prometheus_clients_parser_reads(text: str) -> None:
    """Each label set parsed once, and again from what the last scrape knew: the same series,
    labels and values as parsing every line."""
    expected = [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in SERIES
    ]
    known: dict[str, Mapping[str, str]] = {}
    assert expected == read_exposition(text, known)
    assert expected == read_exposition(text, known)
    assert expected


def test_dcgms_blank_values_are_missing_not_numbers() -> None:
    """DCGM's int64 blank (no value yet) in GPU_UTIL makes the GPU unknown, not 100 % busy."""
    labels = {"gpu": "0", "UUID": "GPU-1", "modelName": "NVIDIA A100-SXM4-80GB"}
    (sample,) = samples_from_series(A100, [(UTIL, labels, 9223372036854775794.0)], START)
    assert sample.util_pct is None
    assert "reports neither DCGM_FI_DEV_GPU_UTIL nor" in str(sample.error)


def test_a_hostname_label_that_disagrees_is_reported_once(
    exporter: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    """The endpoints file names the node; a different Hostname label is one warning."""
    source = DcgmSource({"a100-node-07": exporter.url("/metrics")})
    try:
        with caplog.at_level(logging.WARNING, logger="bot.telemetry"):
            first = source.poll(at(0))
            source.poll(at(0.5))
    finally:
        source.close()
    assert {"a100-node-07"} == {s.node for s in first}
    (line,) = caplog.messages
    assert "calls its host a100-node-01" in line


def test_the_endpoints_file_maps_nodes_to_exporter_urls(tmp_path: Path) -> None:
    """A URL without a path gets the exporter's /metrics."""
    path = tmp_path / "dcgm.yaml"
    path.write_text(
        "a100-node-01: http://a100-node-01:9400/metrics\nh100-node-01: http://10.0.4.12:9400\n"
    )
    assert {
        "a100-node-01": "http://a100-node-01:9400/metrics",
        "h100-node-01": "http://10.0.4.12:9400/metrics",
    } == load_endpoints(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "cannot read it"),
        ("a100-node-01: [http://x]\n", "node names and URLs must be strings"),
        ("- http://a100-node-01:9400\n", "expected a mapping of node names to exporter URLs"),
        ("a100-node-01: a100-node-01:9400\n", "is not an http:// or https:// URL"),
        ("a100-node-01: 'http://x\n", "not YAML"),
    ],
)
def test_a_bad_endpoints_file_says_what_is_wrong(
    tmp_path: Path, text: str | None, expected: str
) -> None:
    path = tmp_path / "dcgm.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(EndpointsError, match=expected) as raised:
        load_endpoints(path)
    assert str(raised.value).startswith(f"GPUBOT_DCGM_ENDPOINTS_FILE={path}: ")
