"""chat.*, conversations.open, users.* and auth through the real slack_sdk WebClient."""

from __future__ import annotations

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.localslack import APP_TOKEN, Channel, LocalSlack

from .conftest import ALICE, BOB

SECTION = {"type": "section", "text": {"type": "mrkdwn", "text": "*hi*"}}


def error_of(call: object) -> str:
    assert isinstance(call, pytest.ExceptionInfo)
    return str(call.value.response["error"])


def test_auth_test_names_the_bot_and_its_scopes(client: WebClient) -> None:
    """Bolt reads user_id, bot_id and team_id, and the scopes header."""
    answer = client.auth_test()
    assert ("U0GPUBOT", "B0GPUBOT", "T0LOCAL") == (
        answer["user_id"],
        answer["bot_id"],
        answer["team_id"],
    )
    assert "chat:write" in answer.headers["x-oauth-scopes"]


@pytest.mark.parametrize(
    ("token", "error"),
    [("xoxb-wrong", "invalid_auth"), (APP_TOKEN, "not_allowed_token_type")],
)
def test_a_wrong_token_is_refused(local: LocalSlack, token: str, error: str) -> None:
    """Only the configured bot token may call the Web API."""
    with pytest.raises(SlackApiError) as refused:
        WebClient(token=token, base_url=local.api_url).chat_postMessage(channel="C0GPU", text="x")
    assert error == error_of(refused)
    assert [] == local.messages("C0GPU")


def test_post_message_to_a_channel(client: WebClient, local: LocalSlack) -> None:
    """The message lands in the channel with Slack's answer shape."""
    answer = client.chat_postMessage(channel="C0GPU", text="hello", blocks=[SECTION])
    message = local.last_message("C0GPU")
    assert message is not None
    assert ("C0GPU", message.ts, "hello") == (
        answer["channel"],
        answer["ts"],
        answer["message"]["text"],
    )
    assert ([SECTION], "B0GPUBOT") == (message.blocks, message.bot_id)
    assert [] == local.violations


def test_post_message_to_a_user_goes_to_their_dm(client: WebClient, local: LocalSlack) -> None:
    """A user id as channel opens the bot's DM with that person; conversations.open agrees."""
    answer = client.chat_postMessage(channel=ALICE, text="your lease is ready")
    dm = local.dm_channel(ALICE)
    assert dm == answer["channel"]
    assert dm == client.conversations_open(users=ALICE)["channel"]["id"]
    assert ["your lease is ready"] == [m.text for m in local.messages(dm)]


def test_conversations_open_with_return_im_reports_an_open_dm(client: WebClient) -> None:
    """The second open is a no-op on an already open IM."""
    client.conversations_open(users=BOB)
    again = client.conversations_open(users=BOB, return_im=True)
    assert (True, True) == (again["already_open"], again["channel"]["is_im"])


@pytest.mark.parametrize(
    ("channel", "error"), [("C0NOPE", "channel_not_found"), ("C0EXTRA", "not_in_channel")]
)
def test_post_message_errors(
    client: WebClient, local: LocalSlack, channel: str, error: str
) -> None:
    """An unknown channel, or one without the bot, is refused."""
    local.workspace.add_channel(Channel(id="C0EXTRA", name="extra", members={ALICE}))
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel=channel, text="x")
    assert error == error_of(refused)


def test_form_encoded_blocks_are_decoded(client: WebClient, local: LocalSlack) -> None:
    """A form body's `blocks` field is a JSON string; an extra team_id is ignored."""
    client.api_call(
        "chat.postMessage",
        data={
            "channel": "C0GPU",
            "text": "form",
            "blocks": '[{"type": "divider"}]',
            "team_id": "T0LOCAL",
        },
    )
    message = local.last_message("C0GPU")
    assert message is not None
    assert [{"type": "divider"}] == message.blocks


def test_update_edits_a_message(client: WebClient, local: LocalSlack) -> None:
    """chat.update replaces text and blocks and marks the message edited."""
    ts = client.chat_postMessage(channel="C0GPU", text="pending", blocks=[SECTION])["ts"]
    answer = client.chat_update(channel="C0GPU", ts=ts, text="approved", blocks=[])
    message = local.last_message("C0GPU")
    assert message is not None
    assert ("approved", [], True) == (message.text, message.blocks, message.edited)
    assert "approved" == answer["text"]


def test_update_keeps_blocks_when_none_are_sent(client: WebClient, local: LocalSlack) -> None:
    """Leaving `blocks` out keeps the old ones, as Slack documents."""
    ts = client.chat_postMessage(channel="C0GPU", text="pending", blocks=[SECTION])["ts"]
    client.chat_update(channel="C0GPU", ts=ts, text="still pending")
    message = local.last_message("C0GPU")
    assert message is not None
    assert [SECTION] == message.blocks


def test_update_cannot_reach_an_ephemeral(client: WebClient) -> None:
    """Ephemerals are not messages to chat.update: message_not_found."""
    ts = client.chat_postEphemeral(channel="C0GPU", user=ALICE, text="only you")["message_ts"]
    with pytest.raises(SlackApiError) as refused:
        client.chat_update(channel="C0GPU", ts=ts, text="changed")
    assert "message_not_found" == error_of(refused)


def test_post_ephemeral_is_for_one_member(client: WebClient, local: LocalSlack) -> None:
    """The ephemeral is Alice's alone; a non-member is refused."""
    client.chat_postEphemeral(channel="C0GPU", user=ALICE, text="only you")
    assert [("C0GPU", "only you")] == [(e.channel, e.text) for e in local.ephemerals(ALICE)]
    assert [] == local.ephemerals(BOB)
    assert [] == local.messages("C0GPU")
    with pytest.raises(SlackApiError) as refused:
        client.chat_postEphemeral(channel="C0VAPPROV", user=ALICE, text="x")
    assert "user_not_in_channel" == error_of(refused)


def test_delete_removes_a_message(client: WebClient, local: LocalSlack) -> None:
    """chat.delete removes it; deleting again finds nothing."""
    ts = client.chat_postMessage(channel="C0GPU", text="oops")["ts"]
    client.chat_delete(channel="C0GPU", ts=ts)
    assert [] == local.messages("C0GPU")
    with pytest.raises(SlackApiError) as refused:
        client.chat_delete(channel="C0GPU", ts=ts)
    assert "message_not_found" == error_of(refused)


def test_users_info_and_lookup_by_email(client: WebClient) -> None:
    """Both answer the same user object; an unknown id is user_not_found."""
    info = client.users_info(user=ALICE)["user"]
    assert ("alice", "Europe/Berlin", False) == (info["name"], info["tz"], info["is_admin"])
    assert info == client.users_lookupByEmail(email="alice@example.com")["user"]
    with pytest.raises(SlackApiError) as refused:
        client.users_info(user="U0NOBODY")
    assert "user_not_found" == error_of(refused)


def test_an_unknown_method_is_a_violation(client: WebClient, local: LocalSlack) -> None:
    """The app calling something the local Slack does not know must not go unnoticed."""
    with pytest.raises(SlackApiError) as refused:
        client.api_call("conversations.mark", params={"channel": "C0GPU"})
    assert "unknown_method" == error_of(refused)
    assert ["conversations.mark: unknown method"] == local.violations


def test_history_finds_a_message_by_its_metadata(client: WebClient, local: LocalSlack) -> None:
    """What the outbox looks for after a crash: the message with its row's id, newest first."""
    client.chat_postMessage(channel="C0GPU", text="one")
    client.chat_postMessage(
        channel="C0GPU",
        text="two",
        metadata={"event_type": "gpubot_outbox", "event_payload": {"outbox_id": 7}},
    )
    plain = client.conversations_history(channel="C0GPU")["messages"]
    assert ["two", "one"] == [m["text"] for m in plain]
    assert all("metadata" not in m for m in plain)
    found = client.conversations_history(channel="C0GPU", include_all_metadata=True)
    assert {"outbox_id": 7} == found["messages"][0]["metadata"]["event_payload"]
    later = client.conversations_history(channel="C0GPU", oldest="9999999999")
    assert [] == later["messages"]


def test_every_call_is_recorded_with_parsed_args(client: WebClient, local: LocalSlack) -> None:
    """Tests assert on what Slack received."""
    client.chat_postMessage(channel="C0GPU", text="hi", blocks=[SECTION])
    call = local.wait_for("chat.postMessage")
    assert {"channel": "C0GPU", "text": "hi", "blocks": [SECTION]} == call.args
    assert call.ok
    assert "Bearer xoxb-local-gpubot" == call.headers["authorization"]


def test_reset_clears_calls_and_violations(client: WebClient, local: LocalSlack) -> None:
    """Back to the seed between scenarios."""
    client.chat_postMessage(channel="C0GPU", text="hi")
    with pytest.raises(SlackApiError):
        client.api_call("nope.nope")
    local.reset()
    assert ([], [], 0) == (local.messages("C0GPU"), local.violations, len(local.calls))


def test_permalink_and_channel_lookups(client: WebClient) -> None:
    """chat.getPermalink, conversations.info and conversations.members answer from the seed."""
    ts = client.chat_postMessage(channel="C0VAPPROV", text="card")["ts"]
    link = client.chat_getPermalink(channel="C0VAPPROV", message_ts=ts)["permalink"]
    assert link.endswith("/archives/C0VAPPROV/p" + ts.replace(".", ""))
    assert "vision-approvals" == client.conversations_info(channel="C0VAPPROV")["channel"]["name"]
    members = client.conversations_members(channel="C0VAPPROV")["members"]
    assert ["U0ADMIN01", "U0GPUBOT", "U0VMGR001"] == members


def test_channel_info_says_whether_the_bot_is_in_it_and_hides_private_ones_it_is_not_in(
    client: WebClient, local: LocalSlack
) -> None:
    """As Slack: `is_member` for the bot; a private channel it is not in is not found."""
    with local.workspace.lock:
        local.workspace.channels["C0RANDOM"] = Channel(id="C0RANDOM", name="random")
        local.workspace.channels["G0SECRET"] = Channel(
            id="G0SECRET", name="secret", is_private=True
        )
    assert client.conversations_info(channel="C0GPU")["channel"]["is_member"] is True
    assert client.conversations_info(channel="C0RANDOM")["channel"]["is_member"] is False
    with pytest.raises(SlackApiError, match="channel_not_found"):
        client.conversations_info(channel="G0SECRET")
