"""Slack's Block Kit limits: refused with invalid_blocks / no_text and recorded as violations."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.localslack import LocalSlack
from bot.localslack.limits import check_blocks, check_view


def section(text: str = "ok") -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def button(action_id: str, text: str = "Go") -> dict[str, Any]:
    return {"type": "button", "action_id": action_id, "text": {"type": "plain_text", "text": text}}


def test_fifty_blocks_pass(client: WebClient, local: LocalSlack) -> None:
    """The limit itself is allowed."""
    client.chat_postMessage(channel="C0GPU", text="many", blocks=[section()] * 50)
    assert [] == local.violations


def test_fifty_one_blocks_are_refused(client: WebClient, local: LocalSlack) -> None:
    """invalid_blocks, nothing posted, and a readable violation."""
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0GPU", text="many", blocks=[section()] * 51)
    assert "invalid_blocks" == refused.value.response["error"]
    assert [] == local.messages("C0GPU")
    assert ["chat.postMessage: invalid_blocks: 51 blocks; Slack allows 50"] == local.violations


def test_a_3001_character_section_is_refused(client: WebClient, local: LocalSlack) -> None:
    """Section text is at most 3000 characters."""
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0GPU", text="long", blocks=[section("x" * 3001)])
    assert "invalid_blocks" == refused.value.response["error"]
    assert [
        "chat.postMessage: invalid_blocks: blocks[0] (section): text is 3001 characters;"
        " Slack allows 3000"
    ] == local.violations


def test_blocks_without_a_text_fallback_are_refused(client: WebClient, local: LocalSlack) -> None:
    """slack_sdk warns, the local Slack refuses with no_text and records it."""
    with (
        pytest.warns(UserWarning, match="top-level `text` argument is missing"),
        pytest.raises(SlackApiError) as refused,
    ):
        client.chat_postMessage(channel="C0GPU", blocks=[section()])
    assert "no_text" == refused.value.response["error"]
    assert ["chat.postMessage: blocks without a top-level `text` fallback"] == local.violations


def test_update_with_invalid_blocks_leaves_the_message(
    client: WebClient, local: LocalSlack
) -> None:
    """A refused chat.update changes nothing."""
    ts = client.chat_postMessage(channel="C0GPU", text="card", blocks=[section("before")])["ts"]
    with pytest.raises(SlackApiError):
        client.chat_update(channel="C0GPU", ts=ts, text="card", blocks=[section("y" * 3001)])
    message = local.last_message("C0GPU")
    assert message is not None
    assert [section("before")] == message.blocks
    assert 1 == len(local.violations)


@pytest.mark.parametrize(
    ("blocks", "problem"),
    [
        (
            [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}],
            "blocks[0] (section): fields has 11 items; Slack allows 10",
        ),
        (
            [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}],
            "blocks[0] (header): text is 151 characters; Slack allows 150",
        ),
        (
            [{"type": "header", "text": {"type": "mrkdwn", "text": "*h*"}}],
            "blocks[0] (header): text type 'mrkdwn' is not plain_text",
        ),
        (
            [{"type": "actions", "elements": [button(f"a{n}") for n in range(26)]}],
            "blocks[0] (actions): 26 elements; Slack allows 25",
        ),
        (
            [{"type": "actions", "elements": [button("a", "b" * 76)]}],
            "blocks[0] (actions) elements[0] (button): text is 76 characters; Slack allows 75",
        ),
        (
            [{"type": "actions", "elements": [button("same"), button("same")]}],
            "blocks[0] (actions) elements[1]: action_id 'same' is used twice",
        ),
        ([{"type": "section"}], "blocks[0] (section): needs text or fields"),
        ([{"type": "sektion"}], "blocks[0] (sektion): unknown block type"),
    ],
)
def test_block_problems_read_plainly(blocks: list[dict[str, Any]], problem: str) -> None:
    """Each limit names the block and the number."""
    assert [problem] == check_blocks(blocks)


def test_valid_blocks_have_no_problems() -> None:
    """A card with header, fields, buttons and context passes."""
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "Borrow request"}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": "*GPUs* 2"}] * 10},
        {
            "type": "actions",
            "block_id": "decision",
            "elements": [button("approve"), button("deny")],
        },
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "ref 42"}]},
        {"type": "divider"},
    ]
    assert [] == check_blocks(blocks)


def test_modal_titles_are_at_most_24_characters() -> None:
    """Title, submit and close are short plain_text; inputs need a submit button."""
    view = {
        "type": "modal",
        "title": {"type": "plain_text", "text": "t" * 25},
        "blocks": [
            {
                "type": "input",
                "label": {"type": "plain_text", "text": "How many"},
                "element": {"type": "number_input", "action_id": "n", "is_decimal_allowed": False},
            }
        ],
    }
    assert [
        "view title: text is 25 characters; Slack allows 24",
        "a modal with input blocks needs a submit button",
    ] == check_view(view)


def test_an_action_id_may_repeat_in_another_block() -> None:
    """One Extend button per lease row: the same action_id in blocks with their own ids."""
    rows = [
        {"type": "actions", "block_id": f"lease:{n}", "elements": [button("extend")]}
        for n in (1, 2)
    ]
    assert [] == check_blocks(rows)


def test_a_home_view_allows_100_blocks() -> None:
    """Views allow twice a message's blocks."""
    assert [] == check_view({"type": "home", "blocks": [section()] * 100})
    assert ["101 blocks; Slack allows 100"] == check_view(
        {"type": "home", "blocks": [section()] * 101}
    )
