"""`gpubot demo`: start the demo and its page, print where to look, run until Ctrl-C."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bot.settings import Settings
from bot.telemetry.nvml import NvmlSource
from bot.telemetry.simulated import SimulatedSource
from bot.telemetry.sources import DEFAULT_FLEET
from bot.workspace.demo import Demo, start
from bot.workspace.history import MARK
from bot.workspace.page import PageServer

# The demo speaks only to loopback; slack_sdk would send even that through a proxy from the
# environment (it ignores NO_PROXY).
PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)


class PortTakenError(RuntimeError):
    """The page's port cannot be bound; the message says which and why, `port` which it was
    (the command line says what to try: `make demo PORT=…` or `gpubot demo --port …`)."""

    def __init__(self, message: str, port: int) -> None:
        super().__init__(message)
        self.port = port


def run(port: int, echo: Callable[[str], None], *, stop: threading.Event | None = None) -> None:
    """Serve the demo on 127.0.0.1:`port` until interrupted (or `stop` is set).

    PortTakenError when the port cannot be bound; the bot's own setup errors as `gpubot serve`
    raises them."""
    try:
        page = PageServer(port)  # first: a taken port fails before anything starts
    except OSError as exc:
        raise PortTakenError(
            f"cannot serve the page on 127.0.0.1:{port}: {exc.strerror}", port
        ) from None
    try:
        for name in PROXY_VARIABLES:
            os.environ.pop(name, None)
        settings = Settings()
        stop = stop or threading.Event()
        with tempfile.TemporaryDirectory(prefix="gpubot-demo-") as data, _stopped_by_sigterm(stop):
            demo = start(Path(data), settings)
            try:
                page.start(demo)
                echo(banner(page.url, demo, settings))
                stop.wait()
            finally:
                page.stop()
                demo.close()
    finally:
        page.stop()


@contextmanager
def _stopped_by_sigterm(stop: threading.Event) -> Iterator[None]:
    """SIGTERM (a service manager, `kill`) ends the demo as Ctrl-C does: cleaned up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, lambda number, frame: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def banner(url: str, demo: Demo, settings: Settings) -> str:
    source = demo.bot.source
    if isinstance(source, SimulatedSource):
        telemetry = f"the simulated fleet ({settings.fleet or DEFAULT_FLEET.name})"
    elif isinstance(source, NvmlSource):
        telemetry = "this host's GPUs, through NVML"
    else:
        telemetry = "node agents only"
    database = demo.bot.settings.database_url
    past = (
        [f"  the two weeks before now are seeded demo data (reasons start with {MARK})"]
        if demo.seeded
        else []
    )
    return "\n".join(
        [
            f"gpubot demo: open {url} in a browser",
            f"  the bot, in HTTP mode:  {demo.bot_url}/slack/events",
            f"  the local Slack API:    {demo.local.api_url}",
            f"  telemetry: {telemetry}; the default rules",
            *past,
            f"  database: {database} (temporary: deleted on Ctrl-C)",
            f"  the admin commands read it: GPUBOT_DATABASE_URL={database} gpubot leases",
            "Press Ctrl-C to stop.",
        ]
    )
