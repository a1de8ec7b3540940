"""Delivering the outbox to Slack: render, send, record where it landed, retry what failed.

No database transaction is open while Slack is called. Rows go out in the order they were owed;
a failure holds back later rows for the same recipient in this pass, so nobody reads a "denied"
before the card it settles.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError

from bot.services.notices import CARDS
from storage import outbox
from storage.db import Database
from storage.tables import OutboxRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rendered:
    text: str
    blocks: list[dict[str, Any]]


# Renders one owed message from the database as it stands now; None: nothing left to say.
# It opens its own short reads: no transaction stays open across a Slack call.
Render = Callable[[OutboxRow], Rendered | None]


@dataclass
class Report:
    delivered: int = 0
    failed: int = 0
    deferred: int = 0
    dropped: int = 0
    errors: list[str] = field(default_factory=list)


class Deliverer:
    """Sends what the outbox owes; one pass per call (the scheduler calls it, and so can tests)."""

    def __init__(
        self, db: Database, client: WebClient, render: Render, clock: Callable[[], datetime]
    ) -> None:
        self.db = db
        self.client = client
        self.render = render
        self.clock = clock
        self._dm: dict[str, str] = {}
        self._pass = threading.Lock()  # one pass at a time, whoever asks
        self._wanted = threading.Event()

    def run(self) -> None:
        """The scheduled job: passes until nothing new was owed while one ran."""
        while True:
            self._wanted.clear()
            self.deliver_due()
            if not self._wanted.is_set():
                return

    def want(self) -> bool:
        """A decision owes something: True when no pass is running (so start one now);
        a running pass sees the wish and goes round once more."""
        self._wanted.set()
        return not self._pass.locked()

    def deliver_due(self, limit: int = 100) -> Report:
        report = Report()
        with self._pass:
            now = self.clock()
            with self.db.read() as session:
                rows = outbox.due(session, now, limit)
            work = [(row, self._prepare(row)) for row in rows]
            blocked: set[str] = set()
            for row, prepared in work:
                assert row.id is not None
                if row.recipient in blocked:
                    report.deferred += 1
                    continue
                try:
                    self._send(row, prepared, report)
                except (SlackApiError, SlackRequestError, OSError) as exc:
                    error = _describe(exc)
                    blocked.add(row.recipient)
                    report.failed += 1
                    report.errors.append(f"{row.kind} {row.subject}: {error}")
                    with self.db.write() as session:
                        retry = outbox.failed(session, row.id, at=self.clock(), error=error)
                    log.warning(
                        "delivery of %s %s failed (%s); retrying at %s",
                        row.kind,
                        row.subject,
                        error,
                        retry.isoformat(),
                    )
        return report

    def _prepare(self, row: OutboxRow) -> Any:
        """Render; card updates also need where the cards landed."""
        rendered = self.render(row)
        if row.kind != "card_settled":
            return rendered
        with self.db.read() as session:
            cards = outbox.landed(session, row.subject, ["approval_card"])
            waiting = [
                r
                for r in outbox.owed_about(session, row.subject)
                if r.kind == "approval_card" and r.state == outbox.PENDING
            ]
        return rendered, [(c.channel, c.ts) for c in cards], bool(waiting)

    def _send(self, row: OutboxRow, prepared: Any, report: Report) -> None:
        assert row.id is not None
        if row.kind == "card_settled":
            rendered, cards, waiting = prepared
            if waiting:  # a card still on its way: update it once it has landed
                report.deferred += 1
                return
            if rendered is None or not cards:
                self._drop(row.id, "no card to update", report)
                return
            for channel, ts in cards:
                self.client.chat_update(
                    channel=channel, ts=ts, text=rendered.text, blocks=rendered.blocks
                )
            self._done(row.id, report, channel=cards[0][0], ts=cards[0][1])
            return
        rendered = prepared
        if rendered is None:
            self._drop(row.id, "nothing left to say", report)
            return
        channel = self._channel_for(row.recipient)
        answer = self.client.chat_postMessage(
            channel=channel, text=rendered.text, blocks=rendered.blocks
        )
        self._done(row.id, report, channel=str(answer["channel"]), ts=str(answer["ts"]))

    def _channel_for(self, recipient: str) -> str:
        """Channels as they are; a person through their DM with the bot (opened once)."""
        if recipient == CARDS or recipient[:1] not in ("U", "W"):
            return recipient
        if recipient not in self._dm:
            opened = self.client.conversations_open(users=recipient)
            self._dm[recipient] = str(opened["channel"]["id"])
        return self._dm[recipient]

    def _done(self, row_id: int, report: Report, *, channel: str, ts: str) -> None:
        with self.db.write() as session:
            outbox.delivered(session, row_id, at=self.clock(), channel=channel, ts=ts)
        report.delivered += 1

    def _drop(self, row_id: int, why: str, report: Report) -> None:
        with self.db.write() as session:
            outbox.dropped(session, row_id, at=self.clock(), why=why)
        report.dropped += 1


def _describe(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return f"slack answered {exc.response.status_code}: {exc.response.get('error', '?')}"
    return f"{type(exc).__name__}: {exc}"
