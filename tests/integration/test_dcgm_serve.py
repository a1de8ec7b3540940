"""`gpubot serve` assembled with GPUBOT_TELEMETRY=dcgm against a DCGM exporter served on
loopback: its poll job reads the exporter, /healthz names the feed, a critical Xid takes the GPU
out of service at the next sweep, and an exporter gone leaves its GPUs unknown; /healthz says
degraded while one node's exporter fails, and telemetry not ok when none answers. On SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.localslack import LocalSlack
from bot.main import Bot, assemble
from bot.settings import Settings
from bot.telemetry.dcgm import DcgmSource
from bot.telemetry.errors import EndpointsError
from storage import gpus
from tests.integration.conftest import settings_for
from tests.unit.telemetry.loopback import Recorded, nothing_listening, recorded

NODE = "a100-node-01"


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def settings(request: pytest.FixtureRequest, local: LocalSlack, tmp_path: Path) -> Settings:
    url = request.getfixturevalue("migrated_postgres_url") if request.param == "postgres" else None
    return settings_for(local, tmp_path, url)


@pytest.fixture
def exporter() -> Iterator[Recorded]:
    with recorded() as server:
        server.record("/metrics", "a100-node-01.prom")
        yield server


def dcgm_bot(settings: Settings, tmp_path: Path, url: str, *more: tuple[str, str]) -> Bot:
    endpoints = tmp_path / "dcgm.yaml"
    endpoints.write_text("".join(f"{node}: {u}\n" for node, u in ((NODE, url), *more)))
    return assemble(
        settings.model_copy(update={"telemetry": "dcgm", "dcgm_endpoints_file": endpoints})
    )


def states(bot: Bot) -> dict[int, str]:
    with bot.db.read() as session:
        return {g.index: g.state for g in gpus.gpu_snapshots(session) if g.node == NODE}


def test_serve_reads_the_exporter_and_takes_a_faulty_gpu_out_of_service(
    settings: Settings, tmp_path: Path, exporter: Recorded
) -> None:
    bot = dcgm_bot(settings, tmp_path, exporter.url("/metrics"))
    try:
        health = bot.health()
        assert 4 == bot.poll()
        now = bot.services.now()
        busy = bot.telemetry.gpu(NODE, 1, now)
        assert (True, 97.0, ()) == (busy.fresh, busy.util_pct, busy.processes)
        bot.sweep()
        before = states(bot)
        exporter.record("/metrics", "a100-node-01-xid.prom")
        bot.poll()
        bot.sweep()
        after = states(bot)
        assert isinstance(bot.source, DcgmSource)
        bot.source.endpoints[NODE] = nothing_listening()
        bot.poll()
        gone = bot.telemetry.gpu(NODE, 0, bot.services.now())
        none_answer = bot.health()
    finally:
        bot.close()
    assert ("dcgm", True) == (health["telemetry"], health["telemetry_ok"])
    assert "1 DCGM exporter" in str(health["telemetry_note"])
    assert "processes are unknown" in str(health["telemetry_note"])
    assert "unhealthy" not in before.values()
    assert ("unhealthy", "unhealthy") == (after[1], after[2])
    assert "unhealthy" not in (after[0], after[3])
    assert (True, None) == (gone.unknown, gone.util_pct)
    assert (True, False, False, [NODE]) == (
        none_answer["ok"],
        none_answer["telemetry_ok"],
        none_answer["telemetry_degraded"],
        none_answer["telemetry_failing_nodes"],
    )
    assert "no DCGM exporter answers" == none_answer["telemetry_note"]


def test_one_node_failing_leaves_healthz_ok_and_degraded_naming_it(
    settings: Settings, tmp_path: Path, exporter: Recorded
) -> None:
    """A node whose exporter refuses connections: healthy and ready still (a restart mends no
    exporter), telemetry ok but degraded, the node named; its neighbour is read."""
    dead = "a100-node-02"
    bot = dcgm_bot(settings, tmp_path, exporter.url("/metrics"), (dead, nothing_listening()))
    try:
        bot.poll()
        health, ready = bot.health(), bot.ready()
        read = bot.telemetry.gpu(NODE, 1, bot.services.now())
    finally:
        bot.close()
    assert (True, True) == (health["ok"], ready["ok"])
    assert (True, True, [dead], 1) == (
        health["telemetry_ok"],
        health["telemetry_degraded"],
        health["telemetry_failing_nodes"],
        health["telemetry_failing_count"],
    )
    assert read.fresh


def test_serve_refuses_dcgm_without_its_endpoints_file(settings: Settings) -> None:
    """One line naming the setting, from the same error `gpubot serve` prints and exits on."""
    with pytest.raises(EndpointsError, match="needs GPUBOT_DCGM_ENDPOINTS_FILE"):
        assemble(settings.model_copy(update={"telemetry": "dcgm"}))
