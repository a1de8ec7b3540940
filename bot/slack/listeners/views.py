"""Modal submissions: the borrow form and the deny-with-a-reason form."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slack_bolt import Ack, App
from slack_sdk import WebClient

from bot.services import Refused
from bot.slack.blocks import (
    BORROW_MODAL,
    DENY_MODAL,
    borrow_from_modal,
    deny_reason_from_modal,
    refused_message,
)
from bot.slack.blocks.kit import Message
from bot.slack.failures import report_failure
from bot.slack.listeners.commands import _borrowed

if TYPE_CHECKING:
    from bot.slack.app import SlackDeps


def _answer_by_dm(
    deps: SlackDeps, client: WebClient, user: str, answer: Callable[[], Message | None]
) -> None:
    """A modal has no response_url: the answer, if any, goes to the person's DM with the bot."""
    try:
        reply = answer()
        if reply is not None:
            channel = client.conversations_open(users=user)["channel"]["id"]
            client.chat_postMessage(channel=channel, **reply.as_kwargs())
    except Exception as exc:  # logged with a reference; a modal has nowhere to show it
        report_failure(exc, None)
    finally:
        deps.kick()


def register(app: App, deps: SlackDeps) -> None:
    services = deps.services

    @app.view(BORROW_MODAL)
    def borrow_submitted(
        ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient
    ) -> None:
        user = body["user"]["id"]
        values = view["state"]["values"]
        asked = borrow_from_modal(
            values, now=deps.now(), tz=deps.people.tz(user), pools=list(services.policy.pools)
        )
        if isinstance(asked, dict):
            ack(response_action="errors", errors=asked)
            return
        ack()
        deps.work.submit(
            _answer_by_dm,
            deps,
            client,
            user,
            lambda: _borrowed(deps, services.borrow(user, asked.to_ask())),
        )

    @app.view(DENY_MODAL)
    def deny_submitted(
        ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient
    ) -> None:
        ack()
        user = body["user"]["id"]
        request_id = int(view["private_metadata"])
        reason = deny_reason_from_modal(view["state"]["values"])

        def denied() -> Message | None:
            # The card itself is updated in place by the delivery of `card_settled`.
            result = services.deny(user, request_id, reason)
            return refused_message(result) if isinstance(result, Refused) else None

        deps.work.submit(_answer_by_dm, deps, client, user, denied)
