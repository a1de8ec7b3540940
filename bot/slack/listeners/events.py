"""Events: opening the App Home tab is recorded and acked; a worker owes a freshly drawn Home,
which the outbox renders from the database as it stands when it is published."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slack_bolt import Ack, App

from bot.slack.inbox import Answer
from storage.tables import InboxRow

if TYPE_CHECKING:
    from bot.slack.deps import SlackDeps


def register(app: App, deps: SlackDeps) -> None:
    @app.event("app_home_opened")
    def home_opened(ack: Ack, body: dict[str, Any], event: dict[str, Any]) -> None:
        if event.get("tab", "home") != "home":
            ack()
            return
        user = str(event["user"])
        payload = {"type": "app_home_opened"}
        deps.accept(ack, body, kind="event", actor=user, payload=payload)


def carry_out(deps: SlackDeps, row: InboxRow, _tz: object) -> Answer:
    return Answer(home=True)
