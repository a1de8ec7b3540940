"""The borrow form (`/gpu borrow` alone, or the Home button) and the deny-reason form, with the
block and action ids their submissions are read by, and readers for those submissions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from bot.slack.blocks.kit import MAX_MODAL_TITLE, Block, clip, context, plain, slack_date
from bot.slack.freetext import read_words
from bot.slack.parse import Borrow
from rules.approvals import MAX_REASON, check_form
from rules.domain import Priority
from rules.policy import Policy


class InputId(NamedTuple):
    """Where a submitted value sits: view.state.values[block_id][action_id]."""

    block_id: str
    action_id: str


BORROW_MODAL = "borrow_modal"  # callback_id
BORROW_POOL = InputId("borrow_pool", "pool")  # static_select
BORROW_COUNT = InputId("borrow_count", "count")  # number_input
BORROW_DURATION = InputId("borrow_duration", "duration")  # plain_text_input: 6h, until fri 18:00
BORROW_PRIORITY = InputId("borrow_priority", "priority")  # static_select
BORROW_REASON = InputId("borrow_reason", "reason")  # plain_text_input, multiline
DENY_MODAL = "deny_modal"  # callback_id; private_metadata is the request id
DENY_REASON = InputId("deny_reason", "reason")  # plain_text_input, multiline, required


def _option(value: str, label: str) -> dict[str, Any]:
    return {"text": plain(label, 75), "value": value}


def _input(
    ids: InputId, label: str, element: dict[str, Any], *, optional: bool = False, hint: str = ""
) -> Block:
    block: Block = {
        "type": "input",
        "block_id": ids.block_id,
        "label": plain(label, 2000),
        "element": {**element, "action_id": ids.action_id},
        "optional": optional,
    }
    if hint:
        block["hint"] = plain(hint, 2000)
    return block


def _modal(callback_id: str, title: str, submit: str, blocks: list[Block]) -> dict[str, Any]:
    return {
        "type": "modal",
        "callback_id": callback_id,
        "title": plain(title, MAX_MODAL_TITLE),
        "submit": plain(submit, MAX_MODAL_TITLE),
        "close": plain("Cancel", MAX_MODAL_TITLE),
        "blocks": blocks,
    }


def borrow_modal(
    pools: Sequence[str], default_pool: str | None, now: datetime, *, most_gpus: int = 0
) -> dict[str, Any]:
    """The borrow form; `views.open` it with the trigger_id of `/gpu borrow` or the Home button.

    `pools`: those the person's team may use; `most_gpus`: the most one request may take in any
    of them (the count's max; the submission is checked by the server whatever a client does).
    """
    options = [_option(p, p) for p in sorted(pools)[:100]]
    pool: dict[str, Any] = {"type": "static_select", "options": options or [_option("-", "-")]}
    if default_pool is not None and default_pool in pools:
        pool["initial_option"] = _option(default_pool, default_pool)
    count: dict[str, Any] = {"type": "number_input", "is_decimal_allowed": False, "min_value": "1"}
    if most_gpus >= 1:
        count["max_value"] = str(most_gpus)
    levels = [_option(p.value, p.value.capitalize()) for p in Priority]
    blocks = [
        _input(BORROW_POOL, "Pool", pool, hint="Only the pools your team has a quota in."),
        _input(BORROW_COUNT, "How many GPUs", count | {"initial_value": "1"}),
        _input(
            BORROW_DURATION,
            "For how long",
            {"type": "plain_text_input", "placeholder": plain("6h", 150)},
            optional=True,
            hint="6h, 90m, 2d, or an end such as until fri 18:00. Empty: the pool's default.",
        ),
        _input(
            BORROW_PRIORITY,
            "Priority",
            {"type": "static_select", "options": levels, "initial_option": levels[1]},
        ),
        _input(
            BORROW_REASON,
            "Why",
            {"type": "plain_text_input", "multiline": True, "max_length": MAX_REASON},
            hint=f"Your manager reads this when the rules ask them. At most {MAX_REASON} "
            "characters.",
        ),
        context(f"End times are read in your time zone. It is now {slack_date(now)}."),
    ]
    return _modal(BORROW_MODAL, "Borrow GPUs", "Borrow", blocks)


def deny_modal(request_id: int) -> dict[str, Any]:
    """Asks the manager why before a request is denied: the requester is told the reason."""
    reason = {"type": "plain_text_input", "multiline": True, "max_length": MAX_REASON}
    blocks = [
        _input(
            DENY_REASON,
            "Why (the requester reads this)",
            reason,
            hint="For example: the team is over quota this week; try the l40s pool.",
        )
    ]
    view = _modal(DENY_MODAL, f"Deny R{request_id}", "Deny", blocks)
    view["private_metadata"] = str(request_id)
    return view


def _value(values: Mapping[str, Any], ids: InputId) -> str:
    block = values.get(ids.block_id)
    state = block.get(ids.action_id) if isinstance(block, Mapping) else None
    if not isinstance(state, Mapping):
        return ""
    selected = state.get("selected_option")
    chosen = selected.get("value") if isinstance(selected, Mapping) else None
    value = chosen or state.get("value") or ""
    return value.strip() if isinstance(value, str) else str(value).strip()


#: The form's fields as rules.approvals.check_form names them, and where each error shows.
_FIELDS = {
    "pool": BORROW_POOL.block_id,
    "count": BORROW_COUNT.block_id,
    "duration": BORROW_DURATION.block_id,
    "reason": BORROW_REASON.block_id,
}


def _count(text: str) -> int | str:
    """The count typed, or what is wrong with it (a client need not enforce number_input)."""
    if not text:
        return "Say how many GPUs you need, for example 2."
    if text.isdecimal():
        return int(text) if len(text) <= 6 else "That is more GPUs than any pool has."
    try:
        float(text)
    except ValueError:
        return "Type a whole number of GPUs, for example 2."
    return "Whole GPUs only: 1, 2, 3 and so on."


def borrow_from_modal(
    values: Mapping[str, Any], *, now: datetime, tz: ZoneInfo, policy: Policy, user: str
) -> Borrow | dict[str, str]:
    """A submitted borrow form as a `Borrow`, or errors by block_id for `response_action`:
    every field is checked, against the rules' hard limits too, before anything is filed."""
    pool = _value(values, BORROW_POOL)
    count = _count(_value(values, BORROW_COUNT))
    errors: dict[str, str] = {}
    if isinstance(count, str):
        errors[BORROW_COUNT.block_id] = count
    words = read_words(_value(values, BORROW_DURATION), now=now, tz=tz, pools=(), leases=False)
    if words.trouble or words.count is not None or words.priority is not None:
        problem = words.trouble or "Say only how long: 6h, 2d, or until fri 18:00."
        errors[BORROW_DURATION.block_id] = clip(problem, 150)
    duration = None if BORROW_DURATION.block_id in errors else words.length(now)
    reason = _value(values, BORROW_REASON)
    gpus = count if isinstance(count, int) else None
    problems = check_form(policy, user, pool=pool, gpus=gpus, duration=duration, reason=reason)
    errors |= {_FIELDS[field]: clip(text, 150) for field, text in problems.items()}
    if errors:
        return errors
    chosen = _value(values, BORROW_PRIORITY)
    priority = Priority(chosen) if chosen in set(Priority) else Priority.NORMAL
    assert isinstance(count, int)
    return Borrow(pool, count, duration, priority, reason)


def end_time_typed(values: Mapping[str, Any]) -> bool:
    """Did the borrow form give an end time (read in the person's zone), not a duration?"""
    return "until" in _value(values, BORROW_DURATION).lower()


def deny_reason_from_modal(values: Mapping[str, Any]) -> str:
    return _value(values, DENY_REASON)


def deny_errors(reason: str) -> dict[str, str]:
    """The deny form's field errors: the requester is owed a reason, and one they can read."""
    if not reason:
        return {DENY_REASON.block_id: "Say why: the requester reads it, and it is audited."}
    if len(reason) > MAX_REASON:
        return {DENY_REASON.block_id: f"At most {MAX_REASON} characters, please."}
    return {}
