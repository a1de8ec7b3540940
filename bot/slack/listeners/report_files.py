"""*Chart* and *CSV* under a `/gpu report` answer. The click is recorded and acked like any
other; carrying it out checks again that the person may see that report, owes the file (an
outbox row of kind REPORT_FILE, drawn and uploaded by the deliverer) and answers at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slack_bolt import Ack

from bot.services import Refused
from bot.services import reports as report_use
from bot.slack.blocks import refused_message
from bot.slack.blocks.kit import Message, message, section
from bot.slack.blocks.reports import (
    REPORT_CHART_ACTION,
    REPORT_CSV_ACTION,
    ReportButton,
    read_button,
)
from bot.slack.inbox import Answer
from bot.slack.people import UTC_ZONE
from rules.reports import WindowError, parse_window
from storage.outbox import OutboxKind, Owed
from storage.tables import InboxRow

if TYPE_CHECKING:
    from bot.slack.deps import SlackDeps

ACTIONS = (REPORT_CHART_ACTION, REPORT_CSV_ACTION)
FORMATS = {REPORT_CHART_ACTION: "png", REPORT_CSV_ACTION: "csv"}
ON_ITS_WAY = {
    "png": "Drawing the chart, it will appear here in a moment.",
    "csv": "Writing the CSV file, it will appear here in a moment.",
}
NOT_YOURS = (
    "This report was made for someone else, so its buttons are not yours; "
    "`/gpu report` makes your own."
)


def accepting(deps: SlackDeps) -> Callable[..., None]:
    """Record a click with the channel it came from (where the file goes)."""

    def clicked(ack: Ack, body: dict[str, Any]) -> None:
        action = body["actions"][0]
        value = str(action.get("value") or "")
        if read_button(value) is None:
            ack()  # not a report this button ever carried: nothing to record
            return
        user = str(body["user"]["id"])
        payload = {
            "action_id": str(action.get("action_id", "")),
            "value": value,
            "user_id": user,
            "channel_id": _channel(body),
            "response_url": str(body.get("response_url") or ""),
            "trigger_id": str(body.get("trigger_id") or ""),
        }
        deps.accept(ack, body, kind="action", actor=user, payload=payload)

    return clicked


def _channel(body: dict[str, Any]) -> str:
    channel = body.get("channel") or {}
    container = body.get("container") or {}
    return str(channel.get("id") or container.get("channel_id") or "")


def asked(deps: SlackDeps, row: InboxRow) -> Answer:
    """The file owed for the clicker, if they may still see that report."""
    user, payload = row.actor, row.payload
    button = read_button(str(payload.get("value", "")))
    if button is None:
        return Answer()
    if button.viewer != user:
        return Answer(reply=refused_message(Refused(NOT_YOURS, "not-yours")))
    refused = _may_not_see(deps, user, button)
    if refused is not None:
        return Answer(reply=refused_message(refused))
    fmt = FORMATS[str(payload["action_id"])]
    data = {
        "viewer": user,
        "scope": str(button.scope.kind),
        "name": button.scope.name,
        "window": button.window,
        "format": fmt,
        "channel": str(payload.get("channel_id") or "") or user,  # no channel: their DM
    }
    owed = Owed(OutboxKind.REPORT_FILE, f"inbox:{row.id}", user, data)
    return Answer(reply=_said(ON_ITS_WAY[fmt]), owed=(owed,))


def _may_not_see(deps: SlackDeps, user: str, button: ReportButton) -> Refused | None:
    """The same check as the command's: the report, built now, or why not."""
    try:
        window = parse_window(button.window, deps.now(), UTC_ZONE)
    except WindowError as exc:
        return Refused(str(exc), "window")
    found = report_use.build(deps.services.ctx, user, button.scope, window)
    return found if isinstance(found, Refused) else None


def _said(text: str) -> Message:
    return message(text, [section(text)])
