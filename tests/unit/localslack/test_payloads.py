"""Payload builders: Slack's shapes, as Bolt recognises them, with fresh tokens registered."""

from __future__ import annotations

from typing import Any

import pytest
from slack_bolt.request import payload_utils

from bot.localslack import LocalSlack, payloads
from bot.localslack.elements import action_payload

from .conftest import ALICE, VICTOR

DECISION = {
    "type": "actions",
    "block_id": "decision",
    "elements": [
        {
            "type": "button",
            "action_id": "approve",
            "text": {"type": "plain_text", "text": "Approve"},
            "value": "req-42",
            "style": "primary",
        },
        {
            "type": "static_select",
            "action_id": "hours",
            "placeholder": {"type": "plain_text", "text": "Hours"},
            "options": [
                {"text": {"type": "plain_text", "text": f"{h} h"}, "value": str(h)} for h in (2, 4)
            ],
        },
    ],
}

FORM_VIEW: dict[str, Any] = {
    "id": "V000000001",
    "type": "modal",
    "callback_id": "borrow",
    "hash": "1.abc",
    "blocks": [
        {
            "type": "input",
            "block_id": "why",
            "label": {"type": "plain_text", "text": "Why"},
            "element": {"type": "plain_text_input", "action_id": "reason"},
        },
        {
            "type": "input",
            "block_id": "pool",
            "label": {"type": "plain_text", "text": "Pool"},
            "element": {
                "type": "static_select",
                "action_id": "pool",
                "options": [{"text": {"type": "plain_text", "text": "A100"}, "value": "a100"}],
            },
        },
        {
            "type": "input",
            "label": {"type": "plain_text", "text": "GPUs"},
            "element": {"type": "number_input", "action_id": "count", "initial_value": "1"},
        },
    ],
}


def test_slash_command_form(local: LocalSlack) -> None:
    """The form fields of Slack's POST, with a response_url and trigger_id the workspace knows."""
    url = payloads.fresh_response_url(local, "C0GPU", ALICE)
    trigger = payloads.fresh_trigger_id(local, ALICE)
    form = payloads.slash_command(ALICE, "borrow 2 for 4h", response_url=url, trigger_id=trigger)
    assert payload_utils.is_slash_command(dict(form))
    assert ("/gpu", "borrow 2 for 4h", "C0GPU", ALICE, "T0LOCAL", "A0GPUBOT") == (
        form["command"],
        form["text"],
        form["channel_id"],
        form["user_id"],
        form["team_id"],
        form["api_app_id"],
    )
    token = url.rsplit("/", 1)[1]
    assert local.workspace.tokens.response_url(token) is not None
    assert trigger in local.workspace.tokens.triggers


def test_block_actions_from_a_message(local: LocalSlack) -> None:
    """container type message, channel, the message with its blocks, the response_url."""
    message = local.workspace.post("C0VAPPROV", "Alice wants 2 GPUs", [DECISION])
    action = action_payload(message.blocks, "approve")
    body = payloads.block_actions(
        VICTOR, action, message, trigger_id="1.2.3", response_url="http://x/response/1"
    )
    assert payload_utils.is_block_actions(body)
    assert {
        "type": "message",
        "message_ts": message.ts,
        "channel_id": "C0VAPPROV",
        "is_ephemeral": False,
    } == body["container"]
    assert ("C0VAPPROV", [DECISION], "http://x/response/1") == (
        body["channel"]["id"],
        body["message"]["blocks"],
        body["response_url"],
    )
    assert ("approve", "decision", "button", "req-42", "primary") == tuple(
        body["actions"][0][key] for key in ("action_id", "block_id", "type", "value", "style")
    )


def test_block_actions_from_an_ephemeral(local: LocalSlack) -> None:
    """is_ephemeral true, and no message to update."""
    ephemeral = local.workspace.post_ephemeral("C0GPU", ALICE, "Cancel?", [DECISION])
    body = payloads.block_actions(
        ALICE, action_payload(ephemeral.blocks, "approve"), ephemeral, trigger_id="1.2.3"
    )
    assert (True, False) == (body["container"]["is_ephemeral"], "message" in body)


def test_block_actions_from_a_view() -> None:
    """container type view and the view; no channel, no response_url."""
    view = {**FORM_VIEW, "blocks": [DECISION]}
    body = payloads.block_actions(
        ALICE, action_payload([DECISION], "hours", "4"), view, trigger_id="t"
    )
    assert {"type": "view", "view_id": "V000000001"} == body["container"]
    assert ("channel" in body, "response_url" in body, body["view"]["id"]) == (
        False,
        False,
        "V000000001",
    )
    assert {"text": {"type": "plain_text", "text": "4 h"}, "value": "4"} == body["actions"][0][
        "selected_option"
    ]


def test_an_action_id_repeated_across_blocks_is_found_in_the_block_named() -> None:
    """Home tabs repeat Extend per lease (block `lease:<id>`); the click names its block."""
    button = {"type": "button", "action_id": "approve", "value": "req-7"}
    blocks: list[dict[str, Any]] = [
        DECISION,
        {"type": "actions", "block_id": "other", "elements": [button]},
    ]
    assert "req-42" == action_payload(blocks, "approve")["value"]
    action = action_payload(blocks, "approve", block_id="other")
    assert ("other", "req-7") == (action["block_id"], action["value"])
    with pytest.raises(LookupError):
        action_payload(blocks, "approve", block_id="nowhere")


def test_view_submission_state_values_per_element_type() -> None:
    """Text value, selected_option, number as a string; unset inputs keep their initial value."""
    body = payloads.view_submission(
        ALICE, FORM_VIEW, {"reason": "training", "pool": "a100"}, trigger_id="t"
    )
    assert payload_utils.is_view_submission(body)
    assert {
        "why": {"reason": {"type": "plain_text_input", "value": "training"}},
        "pool": {
            "pool": {
                "type": "static_select",
                "selected_option": {
                    "text": {"type": "plain_text", "text": "A100"},
                    "value": "a100",
                },
            }
        },
        "b2": {"count": {"type": "number_input", "value": "1"}},
    } == body["view"]["state"]["values"]


def test_view_submission_refuses_unknown_inputs() -> None:
    """A typo in a test is an error, not a silently empty field."""
    with pytest.raises(LookupError, match="no inputs"):
        payloads.view_submission(ALICE, FORM_VIEW, {"reasons": "x"}, trigger_id="t")


def test_app_home_opened_event() -> None:
    """An event_callback with an event id, Home tab, the DM channel."""
    body = payloads.app_home_opened(ALICE, channel="D0ALICE01")
    assert payload_utils.is_app_home_opened_event(body)
    assert body["event_id"].startswith("Ev")
    assert ("home", "D0ALICE01", "U0GPUBOT") == (
        body["event"]["tab"],
        body["event"]["channel"],
        body["authorizations"][0]["user_id"],
    )


def test_url_verification() -> None:
    """The first request of an Events URL."""
    assert {"type": "url_verification", "challenge": "abc"}.items() <= payloads.url_verification(
        "abc"
    ).items()
