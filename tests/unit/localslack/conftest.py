"""Fixtures: a started `LocalSlack`, a real slack_sdk client on it, a clock moved by hand."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from slack_sdk import WebClient

from bot.localslack import BOT_TOKEN, LocalSlack, Workspace

PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)
ALICE, BOB, CAROL = "U0ALICE01", "U0BOB0001", "U0CAROL01"
VICTOR, ADA = "U0VMGR001", "U0ADMIN01"


class Clock:
    """The workspace clock, moved by hand (seconds since the epoch)."""

    def __init__(self, now: float = 1_795_966_298.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """slack_sdk sends even loopback calls to an environment proxy (it ignores NO_PROXY)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def local(clock: Clock) -> Iterator[LocalSlack]:
    with LocalSlack(Workspace.default(clock=clock)) as server:
        yield server


@pytest.fixture
def live_local() -> Iterator[LocalSlack]:
    """A local Slack on the real clock, for tests that hand out trigger_ids to a real app."""
    with LocalSlack(Workspace.default(clock=time.time)) as server:
        yield server


@pytest.fixture
def client(local: LocalSlack) -> WebClient:
    return WebClient(token=BOT_TOKEN, base_url=local.api_url)
