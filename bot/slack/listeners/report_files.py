"""*Chart* and *CSV* under a `/gpu report` answer. The click is recorded and acked like any
other; carrying it out checks again that the person may see that report, owes the file (an
outbox row of kind REPORT_FILE, drawn and uploaded by the deliverer) and answers at once,
saying where it will appear: the channel it was clicked in when everyone there may see it,
else the asker's DM with the bot.
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
from rules.reports import Report, ScopeKind, WindowError, parse_window
from storage.outbox import OutboxKind, Owed
from storage.tables import InboxRow

if TYPE_CHECKING:
    from bot.slack.deps import SlackDeps

ACTIONS = (REPORT_CHART_ACTION, REPORT_CSV_ACTION)
FORMATS = {REPORT_CHART_ACTION: "png", REPORT_CSV_ACTION: "csv"}
ON_ITS_WAY = {"png": "Drawing the chart", "csv": "Writing the CSV file"}
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


def asked(deps: SlackDeps, row: InboxRow, may_share: bool | None = None) -> Answer:
    """The file owed for the clicker, if they may still see that report. `may_share`: whether
    the bot may share where the button was clicked (None: Slack did not say)."""
    user, payload = row.actor, row.payload
    button = read_button(str(payload.get("value", "")))
    if button is None:
        return Answer()
    if button.viewer != user:
        return Answer(reply=refused_message(Refused(NOT_YOURS, "not-yours")))
    built = _built(deps, user, button)
    if isinstance(built, Refused):
        return Answer(reply=refused_message(built))
    fmt = FORMATS[str(payload["action_id"])]
    clicked_in = str(payload.get("channel_id") or "") if may_share is not False else ""
    private = not report_use.for_everyone(built, fmt)
    data = {
        "viewer": user,
        "scope": str(button.scope.kind),
        "name": button.scope.name,
        "window": button.window,
        "format": fmt,
        "channel": user if private or not clicked_in else clicked_in,  # a person: their DM
    }
    owed = Owed(OutboxKind.REPORT_FILE, f"inbox:{row.id}", user, data)
    said = _on_its_way(built, fmt, private, clicked_in, may_share)
    return Answer(reply=_said(said), owed=(owed,))


def _on_its_way(
    report: Report, fmt: str, private: bool, clicked_in: str, may_share: bool | None
) -> str:
    """Where the file will appear, and why when not where the button was clicked."""
    doing = ON_ITS_WAY[fmt]
    if private:
        names = report.scope.kind == ScopeKind.USER or report.by in ("holder", "lease")
        why = "it names people" if names else "not everyone here may see it"
        return f"{doing}; it will appear in your DM with gpubot in a moment, because {why}."
    if not clicked_in:
        why = ", because I cannot post here" if may_share is False else ""
        return f"{doing}; it will appear in your DM with gpubot in a moment{why}."
    if may_share:
        return f"{doing}; it will appear in this channel in a moment."
    # Slack did not say whether the bot is in this conversation: the share will find out.
    return (
        f"{doing}; it will appear here in a moment, "
        "or in your DM with gpubot if I cannot post here."
    )


def _built(deps: SlackDeps, user: str, button: ReportButton) -> Report | Refused:
    """The same check as the command's: the report, built now, or why not."""
    try:
        window = parse_window(button.window, deps.now(), UTC_ZONE)
    except WindowError as exc:
        return Refused(str(exc), "window")
    return report_use.build(deps.services.ctx, user, button.scope, window)


def _said(text: str) -> Message:
    return message(text, [section(text)])
