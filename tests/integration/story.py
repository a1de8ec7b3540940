"""One lease's life told minute by minute, for the timeline tests: telemetry comes in, the
sweep and the queue run, warnings are delivered to the local Slack, and people click.

Time is frozen and moved by the test (freezegun); the sweep, the queue and the outbox delivery
are the job functions themselves, called once a minute as the scheduler would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from freezegun.api import FrozenDateTimeFactory

from bot.localslack import InProcessTransport, LocalSlack, SlackDriver
from bot.main import Bot
from bot.services import BorrowAsk
from bot.services.results import BorrowResult, GpuSlot
from bot.telemetry.model import Sample
from bot.telemetry.window import TelemetryWindow
from tests.builders import a_sample

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
ALICE, ERIN, ADA = "U0ALICE01", "U0ERIN001", "U0ADMIN01"

Util = Callable[[int], "float | str | None"]  # minute -> utilization, "error", or None (silence)


class Story:
    """One lease's life, told minute by minute."""

    def __init__(
        self, bot: Bot, local: LocalSlack, clock: FrozenDateTimeFactory, secret: str
    ) -> None:
        self.bot, self.local, self.clock = bot, local, clock
        self.telemetry = TelemetryWindow(bot.services.policy.timing.stale_after)
        self.slack = SlackDriver(local, InProcessTransport(bot.app), secret)
        self.events: list[tuple[int, str]] = []
        self.minute = 0

    def borrow(self, user: str, pool: str, gpus: int, hours: float) -> int:
        result = self.bot.services.borrow(user, BorrowAsk(pool, gpus, timedelta(hours=hours)))
        assert isinstance(result, BorrowResult)
        if result.lease is None:  # asked: an admin approves at once
            settled = self.bot.services.approve(ADA, result.request.id)
            assert not isinstance(settled, str)
            lease = self.bot.services.leases(user)[0]
            return lease.id
        return result.lease.id

    def run(self, until: int, util: Util, *, lease: int | list[int], sweep: bool = True) -> None:
        """Advance to minute `until`: samples every 30 s, a sweep and a delivery each minute."""
        gpus: list[GpuSlot] = []
        for one in [lease] if isinstance(lease, int) else lease:
            view = self.bot.services.lease(one)
            assert view is not None
            gpus += view.gpus
        while self.minute < until:
            for _ in range(2):
                self.clock.tick(timedelta(seconds=30))
                value = util(self.minute)
                if value is not None:
                    self.telemetry.observe([_sample(s.node, s.index, value) for s in gpus])
            self.minute += 1
            if sweep:
                self.pass_()

    def pass_(self) -> None:
        """One minute of the `sweep` job: the sweep, then the queue, then the deliveries."""
        report = self.bot.services.sweep(self.telemetry)
        self.events += [(self.minute, f"recall {r}") for r in report.recalled]
        self.events += [(self.minute, f"recall withdrawn {r}") for r in report.recall_withdrawn]
        self.events += [(self.minute, f"warn {w.split()[1]}") for w in report.warned]
        self.events += [(self.minute, f"reclaim {r.split()[1]}") for r in report.reclaimed]
        self.events += [(self.minute, f"would {w.split(' ', 1)[1]}") for w in report.would_have]
        self.events += [(self.minute, f"notify {n.split()[0]}") for n in report.notified]
        for lease in self.bot.services.serve_queue():
            self.events.append((self.minute, f"granted {lease.code} to {lease.holder}"))
        self.bot.inbox.wait_idle()
        self.bot.deliverer.idle()
        self.bot.deliverer.deliver_due()

    def lease_events(self) -> list[tuple[int, str]]:
        """The lease's own story, without the notices about processes left behind."""
        return [(m, e) for m, e in self.events if not e.startswith("notify")]

    def click_in_dm(self, user: str, action_id: str) -> None:
        """Click a button on the newest DM that has it, and wait for the bot's answer."""
        dm = self.local.dm_channel(user)
        message = next(m for m in reversed(self.local.messages(dm)) if action_id in str(m.blocks))
        before = len(self.local.calls.of("response_url"))
        self.slack.click(user, message, action_id)
        self.local.wait_for(
            "response_url", lambda a: len(self.local.calls.of("response_url")) > before
        )
        self.events.append((self.minute, f"{user} {action_id}"))

    def answer(self, user: str, text: str) -> str:
        """Type `/gpu text`; what the bot answered through response_url, as one string."""
        before = len(self.local.calls.of("response_url"))
        assert 200 == self.slack.command(user, text).status
        self.local.wait_for(
            "response_url", lambda a: len(self.local.calls.of("response_url")) > before
        )
        return json.dumps(self.local.calls.of("response_url")[before].args)

    def dms(self, user: str) -> list[str]:
        """Each DM the bot sent `user`, text and blocks, oldest first."""
        channel = self.local.dm_channel(user)
        return [m.text + json.dumps(m.blocks) for m in self.local.messages(channel)]

    def posted(self, user: str) -> list[str]:
        """Each DM the bot sent `user` as it was first posted (before any update), oldest first."""
        channel = self.local.dm_channel(user)
        return [
            str(c.args.get("text")) + json.dumps(c.args.get("blocks"))
            for c in self.local.calls.of("chat.postMessage")
            if c.args.get("channel") == channel and not c.faulted
        ]

    def state(self, lease: int) -> str:
        found = self.bot.services.lease(lease)
        assert found is not None
        return found.state


def _sample(node: str, index: int, value: float | str) -> Sample:
    error = "NVMLError_Unknown: the utilization call failed" if value == "error" else None
    util = None if isinstance(value, str) else float(value)
    return a_sample(node, index, util, datetime.now(UTC), error=error)


def busy(minute: int) -> float:
    return 80.0


def idle(minute: int) -> float:
    return 0.0
