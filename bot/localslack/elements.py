"""Interactive Block Kit elements as a person uses them: find one by action_id, shape its value
the way Slack reports it in `actions[]` and in `state.values`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from .model import JSON

TEXT_VALUES = {"plain_text_input", "number_input", "email_text_input", "url_text_input"}
ONE_OPTION = {"static_select", "external_select", "radio_buttons", "overflow"}
MANY_OPTIONS = {"multi_static_select", "multi_external_select", "checkboxes"}
PICKED = {
    "datepicker": "selected_date",
    "timepicker": "selected_time",
    "users_select": "selected_user",
    "conversations_select": "selected_conversation",
    "channels_select": "selected_channel",
    "multi_users_select": "selected_users",
}


def elements(blocks: list[JSON]) -> Iterator[tuple[str, str, JSON]]:
    """(block type, block_id, element) for each interactive element, in order. Blocks without
    a block_id get `b<index>`, standing in for the id Slack would generate."""
    for index, block in enumerate(blocks):
        block_id = block.get("block_id") or f"b{index}"
        kind = block.get("type", "")
        found = [*block.get("elements", []), block.get("accessory"), block.get("element")]
        for element in found:
            if isinstance(element, dict) and element.get("action_id"):
                yield kind, block_id, element


def find(blocks: list[JSON], action_id: str, block_id: str | None = None) -> tuple[str, JSON]:
    """(block_id, element) of the element with `action_id` (in block `block_id`, if given: an
    action_id may repeat across blocks); LookupError naming those there are."""
    seen = []
    for _, found_in, element in elements(blocks):
        if element["action_id"] == action_id and block_id in (None, found_in):
            return found_in, element
        seen.append(element["action_id"])
    raise LookupError(f"no element with action_id {action_id!r}; there are {seen}")


def _option(element: JSON, value: Any) -> JSON:
    options = list(element.get("options", []))
    for group in element.get("option_groups", []):
        options += group.get("options", [])
    for option in options:
        if option.get("value") == value:
            return dict(option)
    raise LookupError(f"{element.get('action_id')!r} has no option {value!r}")


def state(element: JSON, value: Any = None) -> JSON:
    """The element's entry in state.values, holding `value` or else its initial value."""
    kind = element["type"]
    if kind in TEXT_VALUES:
        given = element.get("initial_value") if value is None else value
        return {"type": kind, "value": None if given is None else str(given)}
    if kind in ONE_OPTION:
        if value is None:
            return {"type": kind, "selected_option": element.get("initial_option")}
        return {"type": kind, "selected_option": _option(element, value)}
    if kind in MANY_OPTIONS:
        if value is None:
            return {"type": kind, "selected_options": element.get("initial_options", [])}
        return {"type": kind, "selected_options": [_option(element, v) for v in value]}
    if kind in PICKED:
        initial = next((v for k, v in element.items() if k.startswith("initial_")), None)
        return {"type": kind, PICKED[kind]: initial if value is None else value}
    return {"type": kind, "value": value}


def action_payload(
    blocks: list[JSON], action_id: str, value: Any = None, block_id: str | None = None
) -> JSON:
    """The `actions[0]` Slack sends when a person uses the element (a button: its value, unless
    `value` is given; a select: the option with value `value`)."""
    block_id, element = find(blocks, action_id, block_id)
    action: JSON = {"action_id": action_id, "block_id": block_id}
    if element["type"] == "button":
        action |= {"type": "button", "text": element.get("text")}
        picked = element.get("value") if value is None else value
        if picked is not None:
            action["value"] = picked
        if "style" in element:
            action["style"] = element["style"]
    else:
        action |= state(element, value)
    action["action_ts"] = f"{time.time():.6f}"
    return action


def state_values(blocks: list[JSON], values: Mapping[str, Any]) -> dict[str, dict[str, JSON]]:
    """state.values of a submitted view: every input's entry, `values` (by action_id) applied."""
    result: dict[str, dict[str, JSON]] = {}
    known = set()
    for kind, block_id, element in elements(blocks):
        if kind != "input" and element["type"] == "button":
            continue
        action_id = element["action_id"]
        known.add(action_id)
        result.setdefault(block_id, {})[action_id] = state(element, values.get(action_id))
    unknown = set(values) - known
    if unknown:
        raise LookupError(f"the view has no inputs {sorted(unknown)}; it has {sorted(known)}")
    return result
