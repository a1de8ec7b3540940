"""Threads as Slack keeps them: replies under a parent, broadcasts, conversations.replies."""

from __future__ import annotations

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.localslack import LocalSlack

from .conftest import ALICE, BOB


def test_a_reply_stays_in_its_thread_and_the_parent_counts_it(client: WebClient) -> None:
    """conversations.history shows the parent with reply_count and latest_reply, not the
    reply; conversations.replies shows the parent, then the reply."""
    parent = client.chat_postMessage(channel=ALICE, text="L1 granted")
    reply = client.chat_postMessage(channel=ALICE, text="L1 ends soon", thread_ts=parent["ts"])
    assert parent["ts"] == reply["message"]["thread_ts"]
    dm = parent["channel"]
    history = client.conversations_history(channel=dm)["messages"]
    assert [parent["ts"]] == [m["ts"] for m in history]
    assert (1, reply["ts"], parent["ts"], ["U0GPUBOT"]) == (
        history[0]["reply_count"],
        history[0]["latest_reply"],
        history[0]["thread_ts"],
        history[0]["reply_users"],
    )
    thread = client.conversations_replies(channel=dm, ts=parent["ts"])["messages"]
    assert ["L1 granted", "L1 ends soon"] == [m["text"] for m in thread]


def test_a_broadcast_reply_shows_in_the_conversation_too(client: WebClient) -> None:
    """reply_broadcast puts the reply in the history as a thread_broadcast as well."""
    parent = client.chat_postMessage(channel=BOB, text="L2 granted")
    client.chat_postMessage(
        channel=BOB, text="L2 looks idle", thread_ts=parent["ts"], reply_broadcast=True
    )
    client.chat_postMessage(channel=BOB, text="L2 still idle", thread_ts=parent["ts"])
    history = client.conversations_history(channel=parent["channel"])["messages"]
    assert ["L2 looks idle", "L2 granted"] == [m["text"] for m in history]
    assert "thread_broadcast" == history[0]["subtype"]
    assert 2 == history[1]["reply_count"]


def test_a_reply_to_a_reply_joins_the_same_thread(client: WebClient) -> None:
    """Slack threads are one level deep: the parent's ts is the thread's."""
    parent = client.chat_postMessage(channel=ALICE, text="parent")
    first = client.chat_postMessage(channel=ALICE, text="one", thread_ts=parent["ts"])
    second = client.chat_postMessage(channel=ALICE, text="two", thread_ts=first["ts"])
    assert parent["ts"] == second["message"]["thread_ts"]
    thread = client.conversations_replies(channel=parent["channel"], ts=first["ts"])
    assert ["parent", "one", "two"] == [m["text"] for m in thread["messages"]]


def test_the_parent_is_updated_in_place_and_keeps_its_thread(client: WebClient) -> None:
    """chat.update on a parent changes its text; its replies stay where they were."""
    parent = client.chat_postMessage(channel=ALICE, text="L3 granted")
    client.chat_postMessage(channel=ALICE, text="warned", thread_ts=parent["ts"])
    client.chat_update(channel=parent["channel"], ts=parent["ts"], text="L3 · warning sent")
    [shown] = client.conversations_history(channel=parent["channel"])["messages"]
    assert ("L3 · warning sent", 1) == (shown["text"], shown["reply_count"])
    assert "edited" in shown


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("chat.postMessage", {"text": "x", "thread_ts": "1795966298.999999"}),
        ("conversations.replies", {"ts": "1795966298.999999"}),
    ],
)
def test_an_unknown_thread_is_refused(
    client: WebClient, local: LocalSlack, method: str, args: dict[str, str]
) -> None:
    """A thread_ts or ts that names no message in the conversation: thread_not_found."""
    dm = local.dm_channel(ALICE)
    with pytest.raises(SlackApiError) as refused:
        client.api_call(method, json={"channel": dm, **args})
    assert "thread_not_found" == refused.value.response["error"]
    assert [] == local.messages(dm)


def test_the_snapshot_carries_the_thread_fields(client: WebClient, local: LocalSlack) -> None:
    """The page draws threads from thread_ts, reply_broadcast, reply_count and latest_reply."""
    parent = client.chat_postMessage(channel=ALICE, text="p")
    reply = client.chat_postMessage(
        channel=ALICE, text="r", thread_ts=parent["ts"], reply_broadcast=True
    )
    [dm] = [c for c in local.workspace.snapshot()["channels"] if c["id"] == parent["channel"]]
    first, second = dm["messages"]
    assert (parent["ts"], 1, reply["ts"]) == (
        first["thread_ts"],
        first["reply_count"],
        first["latest_reply"],
    )
    assert (parent["ts"], True) == (second["thread_ts"], second["reply_broadcast"])
