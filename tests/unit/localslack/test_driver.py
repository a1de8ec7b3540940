"""The driver as a person in Slack, against a tiny Bolt app: signed HTTP through Bolt's WSGI
adapter, and in-process dispatch. Forged requests get Bolt's 401."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from slack_bolt import Ack, App, Respond
from slack_bolt.adapter.wsgi import SlackRequestHandler
from slack_sdk import WebClient

from bot.localslack import (
    BOT_TOKEN,
    HttpTransport,
    InProcessTransport,
    LocalSlack,
    SlackDriver,
)
from bot.localslack.driver import SIGNING_SECRET

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
        }
    ],
}
MODAL = {
    "type": "modal",
    "callback_id": "borrow",
    "title": {"type": "plain_text", "text": "Borrow GPUs"},
    "submit": {"type": "plain_text", "text": "Send"},
    "blocks": [
        {
            "type": "input",
            "block_id": "count",
            "label": {"type": "plain_text", "text": "GPUs"},
            "element": {"type": "number_input", "action_id": "n", "is_decimal_allowed": False},
        }
    ],
}


def _gpu(ack: Ack, command: dict[str, Any], client: WebClient) -> None:
    if command["text"] == "card":
        ack()
        client.chat_postMessage(channel="C0VAPPROV", text="Alice wants 2 GPUs", blocks=[DECISION])
    elif command["text"] == "form":
        ack()
        client.views_open(trigger_id=command["trigger_id"], view=MODAL)
    elif command["text"] == "announce":
        ack(text="Maintenance at 18:00", response_type="in_channel")
    else:
        ack(f"pong {command['text']}")


def _borrow(ack: Ack, view: dict[str, Any]) -> None:
    count = int(view["state"]["values"]["count"]["n"]["value"])
    if count > 8:
        ack(response_action="errors", errors={"count": "At most 8 GPUs"})
    elif count == 0:
        title = {"type": "plain_text", "text": "Are you sure?"}
        ack(response_action="update", view={**MODAL, "title": title})
    elif count == 1:
        ack(response_action="clear")
    else:
        ack()


def tiny_app(local: LocalSlack) -> App:
    """/gpu answers pong, posts a card, opens a modal or announces; buttons, views, Home."""
    app = App(
        client=WebClient(token=BOT_TOKEN, base_url=local.api_url), signing_secret=SIGNING_SECRET
    )

    app.command("/gpu")(_gpu)

    @app.action("approve")
    def approve(ack: Ack, body: dict[str, Any], respond: Respond) -> None:
        ack()
        respond(text=f"Approved {body['actions'][0]['value']}", replace_original=True)

    app.view("borrow")(_borrow)

    def publish_home(client: WebClient, user: str, text: str) -> None:
        section = {"type": "section", "text": {"type": "mrkdwn", "text": text}}
        refresh = {
            "type": "button",
            "action_id": "refresh",
            "text": {"type": "plain_text", "text": "Refresh"},
        }
        blocks = [section, {"type": "actions", "elements": [refresh]}]
        client.views_publish(user_id=user, view={"type": "home", "blocks": blocks})

    @app.event("app_home_opened")
    def home(event: dict[str, Any], client: WebClient) -> None:
        publish_home(client, event["user"], "No leases")

    @app.action("refresh")
    def refresh(ack: Ack, body: dict[str, Any], client: WebClient) -> None:
        ack()
        publish_home(client, body["user"]["id"], f"Refreshed from {body['container']['type']}")

    return app


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def app_url(local: LocalSlack) -> Iterator[str]:
    """The tiny app behind Bolt's WSGI adapter on a loopback port."""
    server = make_server("127.0.0.1", 0, SlackRequestHandler(tiny_app(local)), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/slack/events"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def person(local: LocalSlack, app_url: str) -> SlackDriver:
    return SlackDriver(local, HttpTransport(app_url))


def test_a_command_ack_shows_as_an_ephemeral(person: SlackDriver, local: LocalSlack) -> None:
    """Signed form POST, Bolt verifies it, the ack text is shown to Alice only."""
    reply = person.command(ALICE, "ping")
    assert (200, "pong ping") == (reply.status, reply.text)
    assert ["pong ping"] == [e.text for e in local.ephemerals(ALICE, "C0GPU")]
    assert [] == local.messages("C0GPU")
    assert [] == local.violations


@pytest.mark.parametrize("forge", ["signature", "timestamp"])
def test_forged_requests_get_401(person: SlackDriver, local: LocalSlack, forge: Any) -> None:
    """A wrong signature or a ten-minute-old timestamp is refused by Bolt."""
    reply = person.command(ALICE, "ping", forge=forge)
    assert 401 == reply.status
    assert [] == local.ephemerals(ALICE)


def test_an_in_channel_ack_is_a_message_with_the_command_echoed(
    person: SlackDriver, local: LocalSlack
) -> None:
    """Like Slack: the invocation, then the bot's answer, for everyone."""
    person.command(ALICE, "announce")
    assert [(ALICE, "/gpu announce"), ("U0GPUBOT", "Maintenance at 18:00")] == [
        (m.user, m.text) for m in local.messages("C0GPU")
    ]


def test_clicking_a_button_replaces_the_card(person: SlackDriver, local: LocalSlack) -> None:
    """The button's value reaches the app; respond(replace_original) rewrites the card."""
    person.command(ALICE, "card")
    local.wait_for("chat.postMessage")
    card = local.last_message("C0VAPPROV")
    assert card is not None
    assert 200 == person.click(VICTOR, card, "approve").status
    local.wait_for("response_url")
    assert [(card.ts, "Approved req-42")] == [(m.ts, m.text) for m in local.messages("C0VAPPROV")]


def test_a_modal_shows_errors_then_closes(person: SlackDriver, local: LocalSlack) -> None:
    """response_action errors keeps the modal open; a plain ack closes it."""
    person.command(ALICE, "form")
    local.wait_for("views.open")
    [modal] = local.modals(ALICE)
    refused = person.submit(ALICE, modal, {"n": 9})
    assert ("errors", {"count": "At most 8 GPUs"}) == (refused.response_action, refused.errors)
    assert [modal["id"]] == [v["id"] for v in local.modals(ALICE)]
    assert 200 == person.submit(ALICE, modal, {"n": 2}).status
    assert [] == local.modals(ALICE)


def test_response_action_update_and_clear(person: SlackDriver, local: LocalSlack) -> None:
    """update replaces the modal in place; clear closes the whole stack."""
    person.command(ALICE, "form")
    local.wait_for("views.open")
    [modal] = local.modals(ALICE)
    assert "update" == person.submit(ALICE, modal, {"n": 0}).response_action
    [updated] = local.modals(ALICE)
    assert (modal["id"], "Are you sure?") == (updated["id"], updated["title"]["text"])
    assert "clear" == person.submit(ALICE, updated, {"n": 1}).response_action
    assert [] == local.modals(ALICE)


def test_opening_home_publishes_it(person: SlackDriver, local: LocalSlack) -> None:
    """app_home_opened as signed JSON; the app publishes Alice's Home."""
    assert 200 == person.open_home(ALICE).status
    local.wait_for("views.publish")
    home = local.home(ALICE)
    assert home is not None
    assert "No leases" == home["blocks"][0]["text"]["text"]
    person.click(ALICE, home, "refresh")
    local.wait_for("views.publish", lambda args: "Refreshed" in str(args["view"]))
    home = local.home(ALICE)
    assert home is not None
    assert "Refreshed from view" == home["blocks"][0]["text"]["text"]


def test_in_process_dispatch_takes_the_same_bytes(local: LocalSlack) -> None:
    """BoltRequest with the signed body: same answers, same 401 for a forgery."""
    person = SlackDriver(local, InProcessTransport(tiny_app(local)))
    assert "pong hi" == person.command(ALICE, "hi").text
    assert 401 == person.command(ALICE, "hi", forge="signature").status
