"""The borrow form (`/gpu borrow` alone, or the Home button) and the deny-reason form, with the
block and action ids their submissions are read by, and readers for those submissions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from bot.slack.blocks.kit import MAX_MODAL_TITLE, Block, clip, context, plain, slack_date
from bot.slack.freetext import read_words
from bot.slack.parse import Borrow
from rules.domain import Priority


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
DENY_REASON = InputId("deny_reason", "reason")  # plain_text_input, multiline, optional


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


def borrow_modal(pools: Sequence[str], default_pool: str | None, now: datetime) -> dict[str, Any]:
    """The borrow form; `views.open` it with the trigger_id of `/gpu borrow` or the Home button."""
    options = [_option(p, p) for p in sorted(pools)[:100]]
    pool: dict[str, Any] = {"type": "static_select", "options": options or [_option("-", "-")]}
    if default_pool is not None and default_pool in pools:
        pool["initial_option"] = _option(default_pool, default_pool)
    levels = [_option(p.value, p.value.capitalize()) for p in Priority]
    blocks = [
        _input(BORROW_POOL, "Pool", pool),
        _input(
            BORROW_COUNT,
            "How many GPUs",
            {"type": "number_input", "is_decimal_allowed": False, "min_value": "1"}
            | {"initial_value": "1"},
        ),
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
            {"type": "plain_text_input", "multiline": True, "max_length": 2000},
            optional=True,
            hint="Your manager reads this when the rules ask them.",
        ),
        context(f"End times are read in your time zone. It is now {slack_date(now)}."),
    ]
    return _modal(BORROW_MODAL, "Borrow GPUs", "Borrow", blocks)


def deny_modal(request_id: int) -> dict[str, Any]:
    """Asks the manager why (optional) before a request is denied."""
    reason = {"type": "plain_text_input", "multiline": True, "max_length": 1000}
    blocks = [
        _input(
            DENY_REASON,
            "Why (the requester reads this)",
            reason,
            optional=True,
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


def borrow_from_modal(
    values: Mapping[str, Any], *, now: datetime, tz: ZoneInfo, pools: Collection[str]
) -> Borrow | dict[str, str]:
    """A submitted borrow form as a `Borrow`, or errors by block_id for `response_action`."""
    pool, count = _value(values, BORROW_POOL), _value(values, BORROW_COUNT) or "1"
    if pool not in pools:
        return {BORROW_POOL.block_id: "Pick one of the pools."}
    if not count.isdecimal() or not 1 <= int(count) <= 9999:
        return {BORROW_COUNT.block_id: "Ask for at least one GPU."}
    words = read_words(_value(values, BORROW_DURATION), now=now, tz=tz, pools=(), leases=False)
    if words.trouble or words.count is not None or words.priority is not None:
        problem = words.trouble or "Say only how long: 6h, 2d, or until fri 18:00."
        return {BORROW_DURATION.block_id: clip(problem, 150)}
    chosen = _value(values, BORROW_PRIORITY)
    priority = Priority(chosen) if chosen in set(Priority) else Priority.NORMAL
    reason = _value(values, BORROW_REASON)
    return Borrow(pool, int(count), words.length(now), priority, reason)


def end_time_typed(values: Mapping[str, Any]) -> bool:
    """Did the borrow form give an end time (read in the person's zone), not a duration?"""
    return "until" in _value(values, BORROW_DURATION).lower()


def deny_reason_from_modal(values: Mapping[str, Any]) -> str:
    return _value(values, DENY_REASON)
