"""The hybrid feed: DCGM (served on loopback) gives each GPU's numbers and node agents (through
the real signed push) its processes, each with its own age, never another GPU's."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest

from bot.telemetry.dcgm import DcgmSource
from bot.telemetry.model import Sample, to_json
from bot.telemetry.window import GpuReading
from tests.unit.telemetry.builders import NODE, START, IngestRig, a_process, a_sample, at
from tests.unit.telemetry.loopback import Recorded, nothing_listening, recorded

GPU0 = "GPU-3f8a1c2e-6b1d-4e0f-9a52-7c1e0b4d2a10"  # a100-node-01 GPU 0 in the recordings


class Hybrid:
    """One window fed by a DCGM source and by an agent's pushes, on one settable clock."""

    def __init__(self, exporter: Recorded) -> None:
        self.rig = IngestRig()
        self.source = DcgmSource({NODE: exporter.url("/metrics")})

    def scrape(self, minutes: float) -> None:
        self.rig.now = at(minutes)
        self.rig.telemetry.observe(self.source.poll(self.rig.now), self.rig.now)

    def push(self, minutes: float, **fields: object) -> int:
        """The agent's sample of GPU 0 (its own NVML says 88 % busy), with alice's process."""
        self.rig.now = at(minutes)
        sample = agent_sample(taken_at=self.rig.now, **fields)
        status, answer = self.rig.push(to_json([sample]), nonce=f"n-{minutes}")
        assert 200 == status, answer
        return int(json.loads(answer)["taken"])

    def reading(self, minutes: float) -> GpuReading:
        return self.rig.telemetry.gpu(NODE, 0, at(minutes))


def agent_sample(**fields: object) -> Sample:
    values: dict[str, object] = {
        "uuid": GPU0,
        "util_pct": 88.0,
        "memory_used_mib": 123,
        "processes": (a_process(pid=4242, user="alice", started=1741940000.0),),
    }
    return a_sample(**{**values, **fields})


@pytest.fixture
def hybrid() -> Iterator[Hybrid]:
    with recorded() as exporter:
        exporter.record("/metrics", "a100-node-01.prom")
        feed = Hybrid(exporter)
        try:
            yield feed
        finally:
            feed.source.close()


def test_the_agents_processes_join_dcgms_numbers(hybrid: Hybrid) -> None:
    """DCGM says GPU 0 is idle with 2 MiB used; the agent's 88 % and 123 MiB are not taken, its
    process is, with its own time; idleness and history count DCGM's samples only."""
    hybrid.scrape(0)
    assert 1 == hybrid.push(0.2)
    hybrid.scrape(0.5)
    hybrid.scrape(1)
    reading = hybrid.reading(1)
    assert (0.0, 2, True) == (reading.util_pct, reading.memory_used_mib, reading.fresh)
    assert [4242] == [p.pid for p in reading.processes]
    assert (at(0.2), at(1)) == (reading.processes_at, reading.last_seen)
    assert timedelta(minutes=1) == reading.idle_for
    (minute,) = [r for r in hybrid.rig.telemetry.minute_rollups(at(2)) if r.index == 0]
    assert (2, 0.0, 2) == (minute.samples, minute.util_max_pct, minute.memory_used_max_mib)


def test_processes_an_agent_stopped_sending_are_dropped_once_stale(hybrid: Hybrid) -> None:
    """The agent's last word is older than stale_after (3 min): no processes, numbers still
    fresh from DCGM."""
    hybrid.scrape(0)
    hybrid.push(0.1)
    for k in range(1, 9):
        hybrid.scrape(k * 0.5)
    reading = hybrid.reading(4)
    assert (True, (), at(0.1)) == (reading.fresh, reading.processes, reading.processes_at)


def test_an_agent_naming_another_gpu_is_not_believed(
    hybrid: Hybrid, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's GPU 0 has another UUID than DCGM's: its processes are ignored, said once."""
    hybrid.scrape(0)
    with caplog.at_level(logging.WARNING, logger="bot.telemetry"):
        assert 0 == hybrid.push(0.1, uuid="GPU-00000000-0000-0000-0000-000000000000")
        assert 0 == hybrid.push(0.2, uuid="GPU-00000000-0000-0000-0000-000000000000")
    assert () == hybrid.reading(0.2).processes
    (line,) = caplog.messages
    assert f"is {GPU0} to DCGM and GPU-00000000-0000-0000-0000-000000000000" in line


def test_dcgm_unreachable_is_unknown_whatever_the_agent_says(hybrid: Hybrid) -> None:
    """The agent still pushes, busy and fresh, but the numbers' source is down: unknown, and
    no processes on an unknown GPU."""
    hybrid.scrape(0)
    hybrid.source.endpoints[NODE] = nothing_listening()
    hybrid.scrape(0.5)
    hybrid.push(0.6)
    reading = hybrid.reading(0.6)
    assert (True, None, ()) == (reading.unknown, reading.util_pct, reading.processes)


def test_an_agent_alone_still_feeds_everything() -> None:
    """Without DCGM samples a GPU is the agent's, numbers included (the agents-only feed)."""
    rig = IngestRig()
    status, _ = rig.push(to_json([agent_sample(taken_at=START)]))
    reading = rig.telemetry.gpu(NODE, 0, START)
    assert (200, 88.0, [4242], START) == (
        status,
        reading.util_pct,
        [p.pid for p in reading.processes],
        reading.processes_at,
    )
