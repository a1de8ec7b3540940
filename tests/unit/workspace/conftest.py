"""The demo on a simulated fleet, and its page server, for the workspace tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.settings import Settings
from bot.telemetry.sources import DEFAULT_FLEET
from bot.workspace.demo import Demo, start
from bot.workspace.launch import PROXY_VARIABLES
from bot.workspace.page import PageServer
from tests.support.sqlite import migrated_copy

SIMULATED = Settings(_env_file=None, telemetry="simulated", fleet=DEFAULT_FLEET)


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Demo]:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    migrated_copy(tmp_path / "gpubot-demo.db")  # the demo's file, already at head
    running = start(tmp_path, SIMULATED)
    yield running
    running.close()


@pytest.fixture
def page(demo: Demo) -> Iterator[PageServer]:
    server = PageServer(0).start(demo)
    yield server
    server.stop()
