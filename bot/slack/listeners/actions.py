"""Buttons: Approve / Deny / Withdraw on requests, Extend / Release on leases, Borrow on Home."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from slack_bolt import Ack, App, Respond
from slack_sdk import WebClient

from bot.services import Refused
from bot.slack.blocks import (
    APPROVE_ACTION,
    BORROW_OPEN_ACTION,
    CANCEL_ACTION,
    DENY_ACTION,
    EXTEND_ACTION,
    RELEASE_ACTION,
    deny_modal,
    extend_reply,
    refused_message,
    release_reply,
    settle_reply,
)
from bot.slack.blocks.kit import Message, message, section
from bot.slack.listeners.commands import open_borrow_modal

if TYPE_CHECKING:
    from bot.slack.app import SlackDeps

#: What one click on Extend adds; `/gpu extend L7 +6h` asks for any other amount.
EXTEND_STEP = timedelta(hours=2)


def _target(body: dict[str, Any]) -> tuple[str, int | None]:
    action = body["actions"][0]
    value = str(action.get("value") or "")
    return body["user"]["id"], int(value) if value.isdecimal() else None


def _answer(respond: Respond, reply: Message) -> None:
    """An ephemeral note to whoever clicked; the message they clicked stays as it is."""
    respond(**reply.as_kwargs(), response_type="ephemeral", replace_original=False)


def register(app: App, deps: SlackDeps) -> None:
    services = deps.services

    @app.action(APPROVE_ACTION)
    def approve(ack: Ack, body: dict[str, Any], respond: Respond) -> None:
        ack()
        user, request_id = _target(body)
        if request_id is None:
            return
        result = services.approve(user, request_id)
        _answer(
            respond,
            refused_message(result) if isinstance(result, Refused) else settle_reply(result),
        )
        deps.kick()  # the card is updated in place by the delivery of `card_settled`

    @app.action(DENY_ACTION)
    def deny(ack: Ack, body: dict[str, Any], respond: Respond, client: WebClient) -> None:
        ack()
        user, request_id = _target(body)
        if request_id is None:
            return
        refusal = services.may_settle(user, request_id)
        if refusal is not None:
            # Settled already, or not theirs to settle: say so (and audit it) without a form.
            result = services.deny(user, request_id)
            reply = refused_message(result) if isinstance(result, Refused) else settle_reply(result)
            _answer(respond, reply)
            return
        client.views_open(trigger_id=body["trigger_id"], view=deny_modal(request_id))

    @app.action(CANCEL_ACTION)
    def cancel(ack: Ack, body: dict[str, Any], respond: Respond) -> None:
        ack()
        user, request_id = _target(body)
        if request_id is None:
            return
        result = services.cancel(user, request_id)
        if isinstance(result, Refused):
            _answer(respond, refused_message(result))
        else:
            text = f"{result.code} withdrawn."
            _answer(respond, message(text, [section(text)]))
        deps.kick()

    @app.action(EXTEND_ACTION)
    def extend(ack: Ack, body: dict[str, Any], respond: Respond) -> None:
        ack()
        user, lease_id = _target(body)
        if lease_id is None:
            return
        result = services.extend(user, lease_id, EXTEND_STEP, "extended from a button")
        _answer(
            respond,
            refused_message(result) if isinstance(result, Refused) else extend_reply(result),
        )
        deps.kick()

    @app.action(RELEASE_ACTION)
    def release(ack: Ack, body: dict[str, Any], respond: Respond) -> None:
        ack()
        user, lease_id = _target(body)
        if lease_id is None:
            return
        result = services.release(user, lease_id)
        _answer(
            respond,
            refused_message(result) if isinstance(result, Refused) else release_reply(result),
        )
        deps.kick()

    @app.action(BORROW_OPEN_ACTION)
    def borrow_open(ack: Ack, body: dict[str, Any], client: WebClient) -> None:
        ack()
        open_borrow_modal(deps, client, body["trigger_id"], body["user"]["id"])
