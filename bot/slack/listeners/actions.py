"""Buttons: Approve / Deny / Withdraw / Remind approvers / Ask again on requests, Extend /
Release / Still using on leases, Borrow on Home and in unreserved-use DMs, Pause / Resume on an
admin's Home, Chart / CSV under a report (`report_files`). Each click is recorded and acked; a
worker carries it out (`carry_out`) on the id the button carries and answers where the click
happened: through the response_url under a message, by DM (and a redrawn Home tab) for a click
on the Home tab.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from slack_bolt import Ack, App

from bot.services import BorrowAsk, Refused
from bot.services.approval_lifecycle import AskedAgain, Nudged, TooSoon
from bot.services.results import BorrowResult, LeaseView, RequestView
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
from bot.slack.blocks.approval import asked_again_reply, nudge_reply
from bot.slack.blocks.home import PAUSE_ACTION, RESUME_ACTION
from bot.slack.blocks.kit import (
    ASK_AGAIN_ACTION,
    REMIND_ACTION,
    Message,
    message,
    section,
)
from bot.slack.blocks.shrinking import kept_reply, shrink_reply
from bot.slack.blocks.warnings import (
    BORROW_QUICK_ACTION,
    GIVE_BACK_IDLE_ACTION,
    KEEP_ALL_ACTION,
    SNOOZE_ACTION,
)
from bot.slack.inbox import Answer
from bot.slack.listeners import report_files
from bot.slack.listeners.commands import borrow_form, borrowed
from rules.domain import format_duration
from storage.tables import InboxRow

if TYPE_CHECKING:
    from bot.slack.deps import SlackDeps

#: What one click on Extend adds; `/gpu extend L7 +6h` asks for any other amount.
EXTEND_STEP = timedelta(hours=2)
MAX_ID = 2**31 - 1  # ids are database integers; anything larger was never a button's value

# The admin Home's pause switch.
_SWITCHES = (PAUSE_ACTION, RESUME_ACTION)
# The buttons that act on the request or lease id they carry.
_ON_AN_ID = (
    APPROVE_ACTION,
    CANCEL_ACTION,
    EXTEND_ACTION,
    RELEASE_ACTION,
    SNOOZE_ACTION,
    REMIND_ACTION,
    ASK_AGAIN_ACTION,
)
_ON_A_PARTLY_IDLE_LEASE = (GIVE_BACK_IDLE_ACTION, KEEP_ALL_ACTION)


def register(app: App, deps: SlackDeps) -> None:
    for action_id in (*_ON_AN_ID, DENY_ACTION, BORROW_QUICK_ACTION, BORROW_OPEN_ACTION):
        app.action(action_id)(_accepting(deps))
    for action_id in _ON_A_PARTLY_IDLE_LEASE:  # Give back the idle GPUs, Keep
        app.action(action_id)(_accepting(deps))
    for action_id in _SWITCHES:
        app.action(action_id)(_accepting(deps))
    for action_id in report_files.ACTIONS:  # Chart, CSV
        app.action(action_id)(report_files.accepting(deps))


def _accepting(deps: SlackDeps) -> Callable[..., None]:
    def clicked(ack: Ack, body: dict[str, Any]) -> None:
        action = body["actions"][0]
        action_id, value = str(action.get("action_id", "")), str(action.get("value") or "")
        if action_id in (*_ON_AN_ID, *_ON_A_PARTLY_IDLE_LEASE, DENY_ACTION) and _id(value) is None:
            ack()  # a button without an id does nothing; there is nothing to record
            return
        user = str(body["user"]["id"])
        payload = {
            "action_id": action_id,
            "value": value[:200],
            "user_id": user,
            "response_url": str(body.get("response_url") or ""),
            "trigger_id": str(body.get("trigger_id") or ""),
        }
        deps.accept(ack, body, kind="action", actor=user, payload=payload)

    return clicked


def _id(value: str) -> int | None:
    return int(value) if value.isdecimal() and len(value) <= 10 and int(value) <= MAX_ID else None


def carry_out(deps: SlackDeps, row: InboxRow, looked_up: object) -> Answer:
    """A recorded click: the use case on the id it carries, answered where it happened."""
    payload = row.payload
    action_id, value, user = str(payload["action_id"]), str(payload["value"]), row.actor
    home = not payload.get("response_url")  # clicked on the Home tab: no response_url there
    if action_id in _SWITCHES:
        answer = _switched(deps, action_id, user)
    elif action_id in report_files.ACTIONS:
        may_share = looked_up if isinstance(looked_up, bool) else None  # SlackDeps.may_share
        answer = report_files.asked(deps, row, may_share)
    else:
        answer = _act(deps, action_id, user, value)
    return Answer(
        reply=answer.reply, home=home and answer.view is None, view=answer.view, owed=answer.owed
    )


def _act(deps: SlackDeps, action_id: str, user: str, value: str) -> Answer:
    services = deps.services
    if action_id == BORROW_OPEN_ACTION:
        return Answer(view=borrow_form(deps, user))
    if action_id == BORROW_QUICK_ACTION:
        ask = _quick_ask(value)
        return Answer(reply=borrowed(deps, services.borrow(user, ask)) if ask else None)
    target = _id(value)
    if target is None:
        return Answer()
    if action_id == DENY_ACTION:
        if services.may_settle(user, target) is not None:
            # Settled already, or not theirs to settle: say so (and audit it), no form.
            return Answer(reply=_reply(services.deny(user, target), settle_reply))
        return Answer(view=deny_modal(target))
    acts: dict[str, tuple[Callable[[str, int], Any], Callable[[Any], Message]]] = {
        APPROVE_ACTION: (services.approve, settle_reply),
        CANCEL_ACTION: (services.cancel, _withdrawn),
        EXTEND_ACTION: (
            lambda who, lease: services.extend(who, lease, EXTEND_STEP, "extended from a button"),
            extend_reply,
        ),
        RELEASE_ACTION: (services.release, release_reply),
        SNOOZE_ACTION: (services.snooze, lambda lease: _noted(deps, lease)),
        GIVE_BACK_IDLE_ACTION: (services.give_back_idle, shrink_reply),
        KEEP_ALL_ACTION: (services.keep_all, kept_reply),
        REMIND_ACTION: (services.nudge, _nudged),
        ASK_AGAIN_ACTION: (services.ask_again, lambda result: _asked_again(deps, result)),
    }
    act, render = acts[action_id]
    return Answer(reply=_reply(act(user, target), render))


def _switched(deps: SlackDeps, action_id: str, user: str) -> Answer:
    """The admin Home's pause switch: the same use case as `/gpu admin pause` and `resume`."""
    services = deps.services
    result = services.pause(user) if action_id == PAUSE_ACTION else services.resume(user)
    if isinstance(result, Refused):
        return Answer(reply=refused_message(result))
    return Answer(reply=message(result, [section(result)]))


def _quick_ask(value: str) -> BorrowAsk | None:
    """One click from an unreserved-use DM: borrow what the process already uses.
    value: pool:count:minutes[:node:index] (the GPU the process already runs on)"""
    parts = value.split(":")
    pool, count, minutes = [*parts, "", "", ""][:3]
    if not (count.isdecimal() and minutes.isdecimal() and len(count + minutes) <= 12):
        return None
    prefer = ((parts[3], int(parts[4])),) if len(parts) == 5 and parts[4].isdecimal() else ()
    return BorrowAsk(
        pool,
        int(count),
        timedelta(minutes=int(minutes)),
        reason="reserving a GPU already in use",
        prefer=prefer,
    )


def _reply(result: Any, render: Callable[[Any], Message]) -> Message:
    return refused_message(result) if isinstance(result, Refused) else render(result)


def _withdrawn(request: RequestView) -> Message:
    text = f"{request.code} withdrawn."
    return message(text, [section(text)])


def _noted(deps: SlackDeps, lease: LeaseView) -> Message:
    quiet = format_duration(deps.services.policy.timing.snooze)
    text = f"Noted: {lease.code} is in use. No idle warning for the next {quiet}."
    return message(text, [section(text)])


def _asked_again(deps: SlackDeps, result: BorrowResult | AskedAgain) -> Message:
    if isinstance(result, AskedAgain):
        return asked_again_reply(result.request, result.asked)
    return borrowed(deps, result)


def _nudged(result: Nudged | TooSoon) -> Message:
    if isinstance(result, TooSoon):
        return nudge_reply(result.request, (), again_at=result.again_at, ago=result.ago)
    return nudge_reply(result.request, result.approvers, again_at=result.again_at, ago=None)
