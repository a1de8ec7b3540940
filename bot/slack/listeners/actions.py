"""Buttons: Approve / Deny / Withdraw on requests, Extend / Release on leases, Borrow on Home."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from slack_bolt import Ack, App, Respond
from slack_sdk import WebClient

from bot.services import BorrowAsk, Refused
from bot.services.views import LeaseView, RequestView
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
from bot.slack.blocks.warnings import BORROW_QUICK_ACTION, SNOOZE_ACTION
from bot.slack.listeners.commands import _borrowed, open_borrow_modal
from rules.domain import format_duration

if TYPE_CHECKING:
    from bot.slack.app import SlackDeps

#: What one click on Extend adds; `/gpu extend L7 +6h` asks for any other amount.
EXTEND_STEP = timedelta(hours=2)


def _target(body: dict[str, Any]) -> tuple[str, int | None]:
    action = body["actions"][0]
    value = str(action.get("value") or "")
    return body["user"]["id"], int(value) if value.isdecimal() else None


def _reply(result: Any, render: Callable[[Any], Message]) -> Message:
    return refused_message(result) if isinstance(result, Refused) else render(result)


def register(app: App, deps: SlackDeps) -> None:
    services = deps.services
    # One use case per button, on the id the button carries; the card an approval settles
    # is updated in place by the delivery of `card_settled`.
    _button(app, deps, APPROVE_ACTION, services.approve, settle_reply)
    _button(app, deps, CANCEL_ACTION, services.cancel, _withdrawn)
    _button(
        app,
        deps,
        EXTEND_ACTION,
        lambda user, lease: services.extend(user, lease, EXTEND_STEP, "extended from a button"),
        extend_reply,
    )
    _button(app, deps, RELEASE_ACTION, services.release, release_reply)
    _button(app, deps, SNOOZE_ACTION, services.snooze, lambda lease: _noted(deps, lease))
    _deny(app, deps)
    _borrowing(app, deps)


def _button(
    app: App,
    deps: SlackDeps,
    action_id: str,
    act: Callable[[str, int], Any],
    render: Callable[[Any], Message],
) -> None:
    @app.action(action_id)
    def clicked(ack: Ack, body: dict[str, Any], respond: Respond, client: WebClient) -> None:
        ack()
        user, target = _target(body)
        if target is not None:
            deps.after_ack(
                respond, lambda: _reply(act(user, target), render), body=body, client=client
            )


def _deny(app: App, deps: SlackDeps) -> None:
    services = deps.services

    @app.action(DENY_ACTION)
    def deny(ack: Ack, body: dict[str, Any], respond: Respond, client: WebClient) -> None:
        ack()
        user, request_id = _target(body)
        if request_id is None:
            return

        def ask_why() -> Message | None:
            if services.may_settle(user, request_id) is not None:
                # Settled already, or not theirs to settle: say so (and audit it), no form.
                return _reply(services.deny(user, request_id), settle_reply)
            client.views_open(trigger_id=body["trigger_id"], view=deny_modal(request_id))
            return None

        deps.after_ack(respond, ask_why, body=body, client=client)


def _withdrawn(request: RequestView) -> Message:
    text = f"{request.code} withdrawn."
    return message(text, [section(text)])


def _noted(deps: SlackDeps, lease: LeaseView) -> Message:
    quiet = format_duration(deps.services.policy.timing.snooze)
    text = f"Noted: {lease.code} is in use. No idle warning for the next {quiet}."
    return message(text, [section(text)])


def _borrowing(app: App, deps: SlackDeps) -> None:
    services = deps.services

    @app.action(BORROW_QUICK_ACTION)
    def borrow_quick(ack: Ack, body: dict[str, Any], respond: Respond, client: WebClient) -> None:
        """One click from an unreserved-use DM: borrow what the process already uses."""
        ack()
        user = body["user"]["id"]
        # value: pool:count:minutes[:node:index] (the GPU the process already runs on)
        parts = str(body["actions"][0].get("value") or "").split(":")
        pool, count, minutes = [*parts, "", "", ""][:3]
        if not (count.isdecimal() and minutes.isdecimal()):
            return
        prefer = ((parts[3], int(parts[4])),) if len(parts) == 5 and parts[4].isdecimal() else ()
        ask = BorrowAsk(
            pool,
            int(count),
            timedelta(minutes=int(minutes)),
            reason="reserving a GPU already in use",
            prefer=prefer,
        )
        deps.after_ack(
            respond,
            lambda: _borrowed(deps, services.borrow(user, ask)),
            body=body,
            client=client,
        )

    @app.action(BORROW_OPEN_ACTION)
    def borrow_open(ack: Ack, body: dict[str, Any], client: WebClient) -> None:
        ack()
        open_borrow_modal(deps, client, body["trigger_id"], body["user"]["id"])
