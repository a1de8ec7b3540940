"""Events: the App Home tab is drawn afresh each time someone opens it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slack_bolt import App
from slack_sdk import WebClient

from bot.slack.blocks import home_view

if TYPE_CHECKING:
    from bot.slack.app import SlackDeps


def register(app: App, deps: SlackDeps) -> None:
    @app.event("app_home_opened")
    def home_opened(event: dict[str, Any], client: WebClient) -> None:
        if event.get("tab", "home") != "home":
            return
        user = event["user"]
        client.views_publish(user_id=user, view=home_view(deps.services.home(user)))
