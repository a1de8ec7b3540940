"""views.open / push / update / publish: trigger_id rules, hashes, Home tabs."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.localslack import LocalSlack
from bot.localslack.payloads import fresh_trigger_id

from .conftest import ALICE, BOB, Clock


def modal(title: str = "Borrow GPUs", **extra: Any) -> dict[str, Any]:
    return {
        "type": "modal",
        "callback_id": "borrow",
        "title": {"type": "plain_text", "text": title},
        "submit": {"type": "plain_text", "text": "Send"},
        "blocks": [
            {
                "type": "input",
                "block_id": "count",
                "label": {"type": "plain_text", "text": "GPUs"},
                "element": {"type": "number_input", "action_id": "n", "is_decimal_allowed": False},
            }
        ],
        **extra,
    }


def home(text: str) -> dict[str, Any]:
    return {
        "type": "home",
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
    }


def invalid_trigger(refused: pytest.ExceptionInfo[SlackApiError]) -> tuple[str, list[str]]:
    response = refused.value.response
    return response["error"], response["response_metadata"]["messages"]


def test_views_open_shows_a_modal_to_the_trigger_owner(
    client: WebClient, local: LocalSlack
) -> None:
    """The answer is the full view; the modal is on Alice's screen."""
    view = client.views_open(trigger_id=fresh_trigger_id(local, ALICE), view=modal())["view"]
    assert view["id"].startswith("V")
    assert ("borrow", view["id"], "T0LOCAL") == (
        view["callback_id"],
        view["root_view_id"],
        view["team_id"],
    )
    assert [view["id"]] == [v["id"] for v in local.modals(ALICE)]


def test_a_trigger_id_works_once(client: WebClient, local: LocalSlack) -> None:
    """Reuse is invalid_arguments with Slack's message."""
    trigger = fresh_trigger_id(local, ALICE)
    client.views_open(trigger_id=trigger, view=modal())
    with pytest.raises(SlackApiError) as refused:
        client.views_open(trigger_id=trigger, view=modal())
    assert ("invalid_arguments", ["invalid `trigger_id`"]) == invalid_trigger(refused)


def test_a_trigger_id_expires_after_three_seconds(
    client: WebClient, local: LocalSlack, clock: Clock
) -> None:
    """By the workspace clock: 3 s is fine, 3.5 s is too late."""
    on_time, late = fresh_trigger_id(local, ALICE), fresh_trigger_id(local, BOB)
    clock.advance(3.0)
    client.views_open(trigger_id=on_time, view=modal())
    clock.advance(0.5)
    with pytest.raises(SlackApiError) as refused:
        client.views_open(trigger_id=late, view=modal())
    assert ("invalid_arguments", ["invalid `trigger_id`"]) == invalid_trigger(refused)


def test_a_bad_modal_does_not_use_up_the_trigger(client: WebClient, local: LocalSlack) -> None:
    """A 25-character title is invalid_blocks and a violation; the trigger still works."""
    trigger = fresh_trigger_id(local, ALICE)
    with pytest.raises(SlackApiError) as refused:
        client.views_open(trigger_id=trigger, view=modal("t" * 25))
    assert "invalid_blocks" == refused.value.response["error"]
    assert 1 == len(local.violations)
    client.views_open(trigger_id=trigger, view=modal())


def test_views_update_checks_the_hash(client: WebClient, local: LocalSlack) -> None:
    """The current hash updates; a stale one is hash_conflict."""
    opened = client.views_open(trigger_id=fresh_trigger_id(local, ALICE), view=modal())["view"]
    updated = client.views_update(view_id=opened["id"], hash=opened["hash"], view=modal("Step 2"))
    assert (opened["id"], "Step 2") == (updated["view"]["id"], updated["view"]["title"]["text"])
    assert opened["hash"] != updated["view"]["hash"]
    with pytest.raises(SlackApiError) as refused:
        client.views_update(view_id=opened["id"], hash=opened["hash"], view=modal("Step 3"))
    assert "hash_conflict" == refused.value.response["error"]


def test_views_update_by_external_id(client: WebClient, local: LocalSlack) -> None:
    """external_id finds the view too; an unknown one is not_found."""
    client.views_open(trigger_id=fresh_trigger_id(local, ALICE), view=modal(external_id="req-42"))
    client.views_update(external_id="req-42", view=modal("Updated", external_id="req-42"))
    assert ["Updated"] == [v["title"]["text"] for v in local.modals(ALICE)]
    with pytest.raises(SlackApiError) as refused:
        client.views_update(external_id="req-0", view=modal())
    assert "not_found" == refused.value.response["error"]


def test_views_push_stacks_at_most_three(client: WebClient, local: LocalSlack) -> None:
    """Two pushes onto an open modal work; a third is push_limit_reached."""
    client.views_open(trigger_id=fresh_trigger_id(local, ALICE), view=modal())
    for title in ("Second", "Third"):
        client.views_push(trigger_id=fresh_trigger_id(local, ALICE), view=modal(title))
    with pytest.raises(SlackApiError) as refused:
        client.views_push(trigger_id=fresh_trigger_id(local, ALICE), view=modal("Fourth"))
    assert "push_limit_reached" == refused.value.response["error"]
    stack = local.modals(ALICE)
    assert ["Borrow GPUs", "Second", "Third"] == [v["title"]["text"] for v in stack]
    assert stack[1]["id"] == stack[2]["previous_view_id"]


def test_views_publish_keeps_one_home_per_person(client: WebClient, local: LocalSlack) -> None:
    """Republishing keeps the id; each person has their own Home."""
    first = client.views_publish(user_id=ALICE, view=home("no leases"))["view"]
    again = client.views_publish(user_id=ALICE, view=home("1 lease"), hash=first["hash"])["view"]
    assert first["id"] == again["id"]
    published = local.home(ALICE)
    assert published is not None
    assert "1 lease" == published["blocks"][0]["text"]["text"]
    assert local.home(BOB) is None


def test_views_publish_refuses_a_modal(client: WebClient, local: LocalSlack) -> None:
    """The Home tab takes only a home view."""
    with pytest.raises(SlackApiError) as refused:
        client.views_publish(user_id=ALICE, view=modal())
    assert "invalid_arguments" == refused.value.response["error"]
    assert 1 == len(local.violations)
