"""`gpubot serve` where nothing reads a GPU: `auto` on a host without NVML and without node
agents. The bot says so (one log line, /healthz), never builds the simulated fleet, never reclaims
for idleness, and its leases still end on time."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.localslack import LocalSlack
from bot.settings import Settings
from tests.integration.conftest import settings_for, story_with
from tests.integration.story import ALICE, Story


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML finds no GPU, and building the simulated fleet fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the simulated fleet was built")

    monkeypatch.setattr("bot.telemetry.sources.nvml_available", lambda: False)
    monkeypatch.setattr("bot.telemetry.sources.load_fleet", refuse)


def unset(local: LocalSlack, tmp_path: Path, **update: object) -> Settings:
    """settings_for with GPUBOT_TELEMETRY left at its default."""
    return settings_for(local, tmp_path).model_copy(update={"telemetry": "auto", **update})


@pytest.fixture
def blind(local: LocalSlack, tmp_path: Path) -> Iterator[Story]:
    with story_with(unset(local, tmp_path), local) as story:
        story.telemetry = story.bot.telemetry  # the sweep sees what the bot's jobs gathered
        yield story


def test_no_gpu_and_no_agents_is_said_once_in_the_log_and_in_healthz(
    local: LocalSlack, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="bot.telemetry"),
        story_with(unset(local, tmp_path), local) as story,
    ):
        health = story.bot.health()
        assert (None, None) == (story.bot.source, story.bot.ingest)
    assert "none" == health["telemetry"]
    assert "nothing is reclaimed for idleness" in str(health["telemetry_note"])
    assert {"ok", "database", "rules_revision", "engine", "slack", "outbox_pending"} <= set(health)
    (line,) = [m for m in caplog.messages if m.startswith("telemetry")]
    assert line.startswith("telemetry: none: NVML finds no GPU on this host")


def test_agents_configured_is_the_agents_feed(local: LocalSlack, tmp_path: Path) -> None:
    tokens = tmp_path / "agents.yaml"
    tokens.write_text("a100-node-01: s3cret-token-for-node-01\n")
    with story_with(unset(local, tmp_path, agent_tokens_file=tokens), local) as story:
        assert "agents" == story.bot.health()["telemetry"]
        assert story.bot.source is None
        assert story.bot.ingest is not None


def test_agents_asked_for_without_tokens_is_no_telemetry(local: LocalSlack, tmp_path: Path) -> None:
    with story_with(unset(local, tmp_path, telemetry="agents"), local) as story:
        health = story.bot.health()
    assert "none" == health["telemetry"]
    assert "GPUBOT_TELEMETRY=agents" in str(health["telemetry_note"])


def test_without_telemetry_a_lease_is_never_idle_and_still_expires(blind: Story) -> None:
    """No sample ever: six hours of polls and sweeps give no idle warning and no idle reclaim;
    the lease is warned before its end and reclaimed after the grace, as its contract says."""
    lease = blind.borrow(ALICE, "a100", 2, hours=2)
    for _ in range(6 * 60):
        blind.bot.poll()
        blind.run(blind.minute + 1, lambda minute: None, lease=lease)
    assert {} == blind.bot.telemetry.readings(blind.bot.services.now())
    assert [(60, "warn expiry"), (110, "warn expiry"), (150, "reclaim expired")] == blind.events
    assert "reclaimed" == blind.state(lease)


def test_nvml_asked_for_where_it_cannot_be_read_warns_once_and_says_so_in_healthz(
    local: LocalSlack, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`GPUBOT_TELEMETRY=nvml` on a host whose NVML cannot be read (this one, unless it has a
    GPU): each poll goes on, one warning says why, /healthz says the GPUs are not read."""
    from bot.telemetry.nvml import nvml_available

    with (
        caplog.at_level(logging.INFO),
        story_with(unset(local, tmp_path, telemetry="nvml"), local) as story,
    ):
        for _ in range(3):
            story.bot.poll()
        health = story.bot.health()
    if nvml_available():
        assert health["telemetry_ok"] is True
        return
    assert ("nvml", False) == (health["telemetry"], health["telemetry_ok"])
    assert "NVML is not available on this host" in str(health["telemetry_note"])
    warned = [r for r in caplog.records if "the GPUs stay unknown" in r.getMessage()]
    assert 1 == len(warned)
    assert warned[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
