"""response_url semantics through slack_sdk's WebhookClient (what Bolt's respond() uses)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from slack_sdk import WebClient
from slack_sdk.webhook import WebhookClient

from bot.localslack import LocalSlack
from bot.localslack.payloads import fresh_response_url

from .conftest import ALICE, BOB


def test_default_answer_is_an_ephemeral_for_the_invoker(local: LocalSlack) -> None:
    """No response_type: only Alice sees it."""
    url = fresh_response_url(local, "C0GPU", ALICE)
    answer = WebhookClient(url).send(text="Request sent to managers.")
    assert (200, "ok") == (answer.status_code, answer.body)
    assert ["Request sent to managers."] == [e.text for e in local.ephemerals(ALICE, "C0GPU")]
    assert [] == local.messages("C0GPU")


def test_in_channel_posts_for_everyone(local: LocalSlack) -> None:
    """response_type in_channel is a message from the bot."""
    url = fresh_response_url(local, "C0GPU", ALICE)
    WebhookClient(url).send(text="Alice borrowed 2 GPUs", response_type="in_channel")
    message = local.last_message("C0GPU")
    assert message is not None
    assert ("Alice borrowed 2 GPUs", "B0GPUBOT") == (message.text, message.bot_id)


def test_replace_original_replaces_the_clicked_message(
    client: WebClient, local: LocalSlack
) -> None:
    """A button's response_url can rewrite the card it sat on."""
    ts = client.chat_postMessage(channel="C0VAPPROV", text="Approve?")["ts"]
    url = fresh_response_url(local, "C0VAPPROV", BOB, source_ts=ts)
    WebhookClient(url).send(text="Approved by Victor", replace_original=True)
    assert [(ts, "Approved by Victor")] == [(m.ts, m.text) for m in local.messages("C0VAPPROV")]


def test_replace_original_reaches_an_ephemeral_source(local: LocalSlack) -> None:
    """Ephemerals are only replaceable this way."""
    ephemeral = local.workspace.post_ephemeral("C0GPU", ALICE, "Cancel your request?")
    url = fresh_response_url(local, "C0GPU", ALICE, source_ts=ephemeral.ts, ephemeral=True)
    WebhookClient(url).send(text="Cancelled.", replace_original=True)
    assert ["Cancelled."] == [e.text for e in local.ephemerals(ALICE)]


def test_replace_original_after_a_command_replaces_the_last_answer(local: LocalSlack) -> None:
    """For a command the 'original' is the latest ephemeral sent through the same URL."""
    url = fresh_response_url(local, "C0GPU", ALICE)
    webhook = WebhookClient(url)
    webhook.send(text="Working…")
    webhook.send(text="Done.", replace_original=True)
    assert ["Done."] == [e.text for e in local.ephemerals(ALICE)]


def test_delete_original_deletes_the_clicked_message(client: WebClient, local: LocalSlack) -> None:
    """delete_original removes the card."""
    ts = client.chat_postMessage(channel="C0GPU", text="card")["ts"]
    url = fresh_response_url(local, "C0GPU", ALICE, source_ts=ts)
    assert 200 == WebhookClient(url).send_dict({"delete_original": True}).status_code
    assert [] == local.messages("C0GPU")


def test_a_response_url_works_five_times(local: LocalSlack) -> None:
    """The sixth use is answered 404 and shows nothing."""
    webhook = WebhookClient(fresh_response_url(local, "C0GPU", ALICE))
    statuses = [webhook.send(text=f"update {n}").status_code for n in range(6)]
    assert [200, 200, 200, 200, 200, 404] == statuses
    assert 5 == len(local.ephemerals(ALICE))
    assert [200] * 5 + [404] == [call.status for call in local.calls.of("response_url")]


def test_an_unknown_response_url_is_404(local: LocalSlack) -> None:
    """Only URLs the local Slack issued work."""
    assert 404 == WebhookClient(local.response_url("forged")).send(text="x").status_code


def test_invalid_blocks_through_a_response_url_are_a_violation(local: LocalSlack) -> None:
    """The limits hold for respond() too."""
    url = fresh_response_url(local, "C0GPU", ALICE)
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]
    assert 400 == WebhookClient(url).send(text="long", blocks=blocks).status_code
    assert 1 == len(local.violations)
    assert [] == local.ephemerals(ALICE)


def test_a_faulted_response_url_shows_nothing(local: LocalSlack) -> None:
    """Faults apply to response_urls too ("response_url" as the method)."""
    local.faults.add("response_url", status=500)
    answer = WebhookClient(fresh_response_url(local, "C0GPU", ALICE)).send(text="lost")
    assert (500, "internal_error") == (answer.status_code, answer.body)
    assert [] == local.ephemerals(ALICE)


def test_a_body_cut_short_by_a_dying_sender_is_not_acted_on(local: LocalSlack) -> None:
    """A bot killed mid-POST leaves part of its body: nothing is posted, nothing is refused
    as an empty message (Slack acts only on requests it received whole)."""
    url = urlsplit(fresh_response_url(local, "C0GPU", ALICE))
    body = b""  # killed after its headers
    with socket.create_connection((url.hostname or "", url.port or 80), timeout=5) as sock:
        head = f"POST {url.path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body) + 40}\r\n\r\n".encode() + body)
        sock.shutdown(socket.SHUT_WR)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400")
    assert [] == local.ephemerals(ALICE, "C0GPU")
    assert [] == local.violations
