"""The local workspace page in real Chromium: per test a fresh demo (the local Slack API, the real
bot over HTTP, the page on 127.0.0.1) and a fresh browser context, driven by Playwright against
Debian's chromium. The tests fail, never skip, when chromium is missing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ViewportSize, sync_playwright

from bot.settings import Settings
from bot.telemetry.sources import DEFAULT_FLEET
from bot.workspace.demo import Demo, start
from bot.workspace.launch import PROXY_VARIABLES
from bot.workspace.page import PageServer
from tests.browser.workspace import SlackPage
from tests.support.sqlite import migrated_copy

# Debian's package; GPUBOT_TEST_CHROMIUM names another Chromium binary (e.g. on a laptop).
CHROMIUM = Path(os.environ.get("GPUBOT_TEST_CHROMIUM") or "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers often give /dev/shm 64 MB, too little for Chromium
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[2]


# Package scope, not session: while Playwright's sync API runs, its event loop is the main
# thread's running loop, and the later tests' asyncio.run() would refuse to start.
@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless; Playwright starts it with a fresh user data dir."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests drive Debian's chromium. `make test` "
            "installs it (apt-get install chromium), or set GPUBOT_TEST_CHROMIUM to a Chromium "
            "binary; never `playwright install`.",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=ARGS
        )
        yield launched
        launched.close()


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Demo]:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    migrated_copy(tmp_path / "gpubot-demo.db")  # the demo's file, already at head
    # The simulated fleet even on a GPU host: the story depends on its people and their work.
    running = start(tmp_path, Settings(_env_file=None, telemetry="simulated", fleet=DEFAULT_FLEET))
    yield running
    running.close()
    assert [] == running.local.violations


@pytest.fixture
def viewport(request: pytest.FixtureRequest) -> ViewportSize:
    """1440x900 unless a test parametrises it (indirect) with LAPTOP or DESKTOP."""
    size: ViewportSize = {"width": 1440, "height": 900}
    return getattr(request, "param", size)


@pytest.fixture
def slack(
    browser: Browser, demo: Demo, tmp_path: Path, viewport: ViewportSize
) -> Iterator[SlackPage]:
    """The page as a person in Berlin sees it; a JavaScript error fails the test."""
    page_server = PageServer(0).start(demo)
    context = browser.new_context(viewport=viewport, timezone_id="Europe/Berlin", locale="en-US")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    shots = ROOT / "docs" if os.environ.get("GPUBOT_SCREENSHOTS") else tmp_path
    yield SlackPage(page, demo, page_server.url, shots)
    context.close()
    page_server.stop()
    assert [] == errors
