"""Fixtures of the agent tests: the real /proc reader, and child processes reaped after."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from bot.telemetry.procs import ProcReader


@pytest.fixture
def procs() -> ProcReader:
    return ProcReader()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Children started by the test (builders.spawn); killed and reaped whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
