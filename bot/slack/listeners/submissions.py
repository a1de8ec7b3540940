"""Modal submissions: the borrow form and the deny-with-a-reason form.

Field errors are answered in the ack (`response_action: errors`); a valid form is recorded and
acked, and a worker carries it out (`carry_out`). A modal has no response_url, so its answer, if
any, goes to the person's DM with the bot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slack_bolt import Ack, App

from bot.services import Refused
from bot.slack.blocks import (
    BORROW_MODAL,
    DENY_MODAL,
    borrow_from_modal,
    deny_reason_from_modal,
    refused_message,
)
from bot.slack.blocks.kit import message, section
from bot.slack.blocks.modals import deny_errors, end_time_typed
from bot.slack.inbox import Answer
from bot.slack.listeners.commands import borrowed, owning_up
from bot.slack.people import UTC_ZONE, Zone
from storage.tables import InboxRow

if TYPE_CHECKING:
    from bot.slack.deps import SlackDeps

__all__ = ["BORROW_MODAL", "DENY_MODAL", "carry_out", "register"]


def register(app: App, deps: SlackDeps) -> None:
    @app.view(BORROW_MODAL)
    def borrow_submitted(ack: Ack, body: dict[str, Any], view: dict[str, Any]) -> None:
        """Every field is checked here, against the rules in force, before anything is filed."""
        user = str(body["user"]["id"])
        values = view["state"]["values"]
        tz = deps.people.known_tz(user) or UTC_ZONE
        policy = deps.services.policy
        asked = borrow_from_modal(values, now=deps.now(), tz=tz, policy=policy, user=user)
        if isinstance(asked, dict):
            ack(response_action="errors", errors=asked)
            return
        payload = {"callback_id": BORROW_MODAL, "values": values}
        deps.accept(ack, body, kind="view", actor=user, payload=payload)

    @app.view(DENY_MODAL)
    def deny_submitted(ack: Ack, body: dict[str, Any], view: dict[str, Any]) -> None:
        request = str(view.get("private_metadata") or "")
        if not request.isdecimal() or len(request) > 10:
            ack()  # not a form this bot opened: nothing to record
            return
        user = str(body["user"]["id"])
        reason = deny_reason_from_modal(view["state"]["values"])
        errors = deny_errors(reason)
        if errors:
            ack(response_action="errors", errors=errors)
            return
        payload = {"callback_id": DENY_MODAL, "request": int(request), "reason": reason}
        deps.accept(ack, body, kind="view", actor=user, payload=payload)


def carry_out(deps: SlackDeps, row: InboxRow, zone: Zone | None) -> Answer:
    """A recorded form: borrow, or deny with the reason given."""
    services, payload, user = deps.services, row.payload, row.actor
    if payload["callback_id"] == BORROW_MODAL:
        tz = zone.tz if zone is not None else UTC_ZONE
        asked = borrow_from_modal(
            payload["values"], now=deps.now(), tz=tz, policy=services.policy, user=user
        )
        if isinstance(asked, dict):  # valid in UTC, not in the person's own zone
            text = "Your borrow form was not sent: " + " ".join(asked.values())
            return Answer(reply=message(text, [section(text)]))
        reply = borrowed(deps, services.borrow(user, asked.to_ask()))
        return Answer(reply=owning_up(reply, zone) if end_time_typed(payload["values"]) else reply)
    # The card itself is updated in place by the delivery of `card_settled`.
    result = services.deny(user, int(payload["request"]), str(payload.get("reason") or ""))
    return Answer(reply=refused_message(result) if isinstance(result, Refused) else None)
