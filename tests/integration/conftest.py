"""The real bot, end to end: the Bolt app served over HTTP on loopback (uvicorn, as `gpubot
serve --http` runs it), talking to the local Slack Web API, driven by signed requests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory
from pydantic import SecretStr

from bot.localslack import BOT_TOKEN, HttpTransport, LocalSlack, SlackDriver
from bot.main import Bot, assemble
from bot.server import Background, SlackAsgi
from bot.settings import DEFAULT_RULES_DIR, Settings
from tests.integration.story import T0, Story
from tests.support.sqlite import migrated_copy

SECRET = "local-signing-secret"  # noqa: S105  (the local workspace's, never real)
PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """slack_sdk sends even loopback calls to an environment proxy (it ignores NO_PROXY)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def local() -> Iterator[LocalSlack]:
    with LocalSlack() as server:
        yield server


def settings_for(local: LocalSlack, tmp_path: Path, database_url: str | None = None) -> Settings:
    """The bot on the shipped rules, a SQLite file in `tmp_path`, the local Slack API and the
    simulated fleet (asked for by name: `auto` never simulates). A new file starts as a copy
    of one already migrated (tests/support/sqlite.py)."""
    if database_url is None:
        database_url = f"sqlite:///{migrated_copy(tmp_path / 'gpubot.db')}"
    return Settings(
        database_url=database_url,
        rules_dir=DEFAULT_RULES_DIR,
        telemetry="simulated",
        SLACK_BOT_TOKEN=SecretStr(BOT_TOKEN),
        SLACK_SIGNING_SECRET=SecretStr(SECRET),
        SLACK_API_URL=local.api_url,
    )


@dataclass
class Running:
    """A bot served on loopback, and a driver acting as people in the local workspace."""

    bot: Bot
    local: LocalSlack
    url: str
    slack: SlackDriver

    def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait for work a listener does after its ack (Bolt runs it on a thread)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the condition did not come true in time")
            time.sleep(0.01)

    def deliver(self) -> None:
        """Let the requests in hand finish and their answers go out, then run the outbox job
        until nothing it can send is left (tests call jobs directly)."""
        self.bot.inbox.wait_idle()
        self.bot.deliverer.idle()
        for _ in range(10):
            report = self.bot.deliverer.deliver_due()
            if not report.delivered and not report.dropped:
                return


@pytest.fixture
def running(local: LocalSlack, tmp_path: Path) -> Iterator[Running]:
    bot = assemble(settings_for(local, tmp_path))
    http = Background(SlackAsgi(bot.app, bot.health))
    yield Running(
        bot, local, http.url, SlackDriver(local, HttpTransport(http.url + "/slack/events"), SECRET)
    )
    http.stop()
    bot.close()


@contextmanager
def story_with(settings: Settings, local: LocalSlack) -> Iterator[Story]:
    """The bot assembled from `settings` on a frozen clock the test moves."""
    with freeze_time(T0) as clock:
        assert isinstance(clock, FrozenDateTimeFactory)  # not ticking: the test moves time
        bot = assemble(settings)
        try:
            yield Story(bot, local, clock, SECRET)
        finally:
            bot.close()


@pytest.fixture
def story(local: LocalSlack, tmp_path: Path) -> Iterator[Story]:
    """The bot on the shipped rules, for timelines told minute by minute."""
    with story_with(settings_for(local, tmp_path), local) as told:
        yield told
