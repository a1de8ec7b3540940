"""One process, the whole demo: the local Slack API, the real bot served over HTTP exactly as
`gpubot serve --http` serves it (its jobs running), the opening leases, and fast-forward.

The page (`page.py`) sits on top; tests and `gpubot demo` start this first.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from pydantic import SecretStr

from bot.jobs import POLL, ROLLUP, SWEEP
from bot.localslack import BOT_TOKEN, HttpTransport, LocalSlack, SlackDriver, Workspace
from bot.localslack.driver import SIGNING_SECRET
from bot.main import POLL_EVERY, ROLLUP_EVERY, SWEEP_EVERY, Bot, assemble
from bot.server import Background, SlackAsgi
from bot.settings import DEFAULT_RULES_DIR, Settings
from bot.telemetry.simulated import SimulatedSource
from bot.workspace import history
from bot.workspace.clock import DemoClock
from bot.workspace.opening import seed

log = logging.getLogger(__name__)
ACK_TIMEOUT_S = 3.0  # Slack gives up on an app's answer after three seconds
MAX_FORWARD = timedelta(days=1)


class ForwardBusyError(RuntimeError):
    """A fast-forward was asked for while another one still moves the clock."""


@dataclass
class Demo:
    """The running parts; `forward` moves the demo clock with the jobs the bot would run,
    `forward_later` does it on a thread of its own for the page."""

    local: LocalSlack
    bot: Bot
    clock: DemoClock
    slack: SlackDriver
    bot_url: str
    _http: Background
    _time: threading.Lock = field(default_factory=threading.Lock)
    progress: tuple[int, int] | None = None  # (steps done, steps) while fast-forwarding
    forwards_done: int = 0  # the number of the last fast-forward `forward_later` finished
    forward_error: str | None = None  # why the last fast-forward stopped early, if it did
    seeded: int = 0  # the past leases seeded before the start (none on this host's own GPUs)
    read_up_to: dict[tuple[str, str], str] = field(default_factory=dict)  # (person, channel)
    _forwards: int = 0
    _mover: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _starting: threading.Lock = field(default_factory=threading.Lock)

    def forward(self, by: timedelta) -> None:
        """Move time on in poll-sized steps: a poll every step, a sweep and the deliveries it
        owes every minute, as the jobs would have done had the time really passed."""
        if not timedelta(0) < by <= MAX_FORWARD:
            raise ValueError(f"fast-forward between a second and {MAX_FORWARD}")
        steps = math.ceil(by / POLL_EVERY)
        per_sweep = max(1, round(SWEEP_EVERY / POLL_EVERY))
        with self._time:
            try:
                for step in range(1, steps + 1):
                    if self._stopping.is_set():
                        return
                    self.progress = (step - 1, steps)
                    self.clock.advance(min(POLL_EVERY, by - POLL_EVERY * (step - 1)))
                    self.bot.poll()
                    if step % per_sweep == 0 or step == steps:
                        self.bot.sweep()
                        self.deliver()
                self.bot.rollup()  # the hours the clock moved past go into the hourly table
            finally:
                self.progress = None

    def forward_later(self, by: timedelta) -> int:
        """Start `forward(by)` on a thread and answer at once with its number; the page shows
        `progress` until `forwards_done` reaches it. One fast-forward at a time."""
        if not timedelta(0) < by <= MAX_FORWARD:
            raise ValueError(f"fast-forward between a second and {MAX_FORWARD}")
        with self._starting:
            if self._mover is not None and self._mover.is_alive():
                raise ForwardBusyError("the clock is already moving; wait until it is done")
            self._forwards += 1
            job = self._forwards
            self.progress = (0, math.ceil(by / POLL_EVERY))
            self._mover = threading.Thread(
                target=self._move, args=(by, job), name="demo-forward", daemon=True
            )
            self._mover.start()
        return job

    def _move(self, by: timedelta, job: int) -> None:
        try:
            self.forward(by)
            self.forward_error = None
        except Exception as exc:  # shown on the page and logged, never a silent stop
            log.exception("demo: fast-forward failed")
            self.forward_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.progress = None
            self.forwards_done = job

    def deliver(self) -> None:
        """Run the outbox until nothing it can send is left."""
        for _ in range(20):
            report = self.bot.deliverer.deliver_due()
            if not report.delivered and not report.dropped:
                return

    def locked(self, job: Callable[[], object]) -> Callable[[], None]:
        """A job that waits while time is being moved (the scheduler runs jobs on threads)."""

        def run() -> None:
            with self._time:
                job()

        return run

    def close(self) -> None:
        self._stopping.set()
        if self._mover is not None:
            self._mover.join(30)
        self._http.stop()
        self.bot.close()
        self.local.stop()


def demo_settings(base: Settings, local: LocalSlack, data_dir: Path) -> Settings:
    """The simulated fleet (this host's GPUs when GPUBOT_TELEMETRY=nvml asks for them), on a
    fresh SQLite file, the default rules (the demo's people are theirs) and the local Slack API."""
    return base.model_copy(
        update={
            "telemetry": "nvml" if base.telemetry == "nvml" else "simulated",
            "database_url": f"sqlite:///{data_dir / 'gpubot-demo.db'}",
            "rules_dir": DEFAULT_RULES_DIR,
            "agent_tokens_file": None,
            "slack_bot_token": SecretStr(BOT_TOKEN),
            "slack_signing_secret": SecretStr(SIGNING_SECRET),
            "slack_app_token": None,
            "slack_api_url": local.api_url,
        }
    )


def start(data_dir: Path, base: Settings | None = None) -> Demo:
    """Start everything but the page; the opening leases are granted and delivered already."""
    clock = DemoClock()
    local = LocalSlack(Workspace.default(clock=clock.timestamp)).start()
    try:
        bot = assemble(demo_settings(base or Settings(), local, data_dir), clock=clock)
    except BaseException:
        local.stop()
        raise
    open_approval_channels(local.workspace, bot)
    try:
        http = Background(SlackAsgi(bot.app, bot.health, ingest=bot.ingest))
    except BaseException:
        bot.close()
        local.stop()
        raise
    driver = SlackDriver(local, HttpTransport(http.url + "/slack/events", timeout=ACK_TIMEOUT_S))
    demo = Demo(local, bot, clock, driver, http.url, http)
    try:
        _open(demo)
    except BaseException:
        demo.close()
        raise
    return demo


def _open(demo: Demo) -> None:
    """A first poll, the opening leases and their messages, then the jobs (time-locked)."""
    bot = demo.bot
    bot.poll()  # the opening leases go on GPUs the telemetry has seen, the panel has readings
    if isinstance(bot.source, SimulatedSource):
        nodes = {name: node.spec for name, node in bot.source.nodes.items()}
        for line in seed(bot.services, nodes):
            log.info("demo lease: %s", line)
        demo.seeded = history.seed(bot.db, bot.services.policy, bot.services.now())
        log.info("demo history: %d past leases over the last two weeks", demo.seeded)
    demo.deliver()
    bot.jobs.every(POLL, POLL_EVERY, demo.locked(bot.poll))
    bot.jobs.every(SWEEP, SWEEP_EVERY, demo.locked(bot.sweep))
    bot.jobs.every(ROLLUP, ROLLUP_EVERY, demo.locked(bot.rollup))
    bot.jobs.start()


def open_approval_channels(workspace: Workspace, bot: Bot) -> None:
    """A team reads its approval channel, so a non-manager sees the cards (and is refused)."""
    for team in bot.services.policy.teams.values():
        channel = workspace.channel(team.approval_channel) if team.approval_channel else None
        if channel is not None:
            channel.members |= team.members | team.managers
            workspace.add_channel(channel)
