"""Socket Mode over the standard-library WebSocket: the handshake, hello, envelopes and acks."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from slack_bolt import Ack, App
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_sdk import WebClient
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.client import BaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest

from bot.localslack import (
    APP_TOKEN,
    BOT_TOKEN,
    LocalSlack,
    SlackDriver,
    SocketTransport,
    frames,
    payloads,
)

from .conftest import ALICE


def test_accept_key_matches_rfc_6455() -> None:
    """The RFC's own example key and answer."""
    assert "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" == frames.accept_key("dGhlIHNhbXBsZSBub25jZQ==")


@pytest.mark.parametrize("size", [5, 300, 70_000])
def test_masked_client_frames_unmask(size: int) -> None:
    """Short, 16-bit and 64-bit lengths, masked as a client sends them."""
    payload, mask = b"x" * size, b"\x01\x02\x03\x04"
    head = bytes([0x81])
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    stream = io.BufferedReader(io.BytesIO(head + mask + masked))
    assert (frames.TEXT, payload) == frames.read_message(stream)


def test_the_builtin_client_connects_and_hears_hello(local: LocalSlack) -> None:
    """apps.connections.open with the app token, ws:// handshake, hello, an envelope, its ack."""
    hello: list[dict[str, Any]] = []
    said_hello = threading.Event()
    answered: list[SocketModeRequest] = []

    def listen(_client: BaseSocketModeClient, message: dict[str, Any], _raw: str | None) -> None:
        if message.get("type") == "hello":  # listeners run on a pool, in any order
            hello.append(message)
            said_hello.set()

    def ack(socket_client: BaseSocketModeClient, request: SocketModeRequest) -> None:
        answered.append(request)
        socket_client.send_socket_mode_response({"envelope_id": request.envelope_id})

    client = SocketModeClient(app_token=APP_TOKEN, web_client=WebClient(base_url=local.api_url))
    client.message_listeners.append(listen)
    client.socket_mode_request_listeners.append(ack)
    client.connect()
    envelope = {"user_id": ALICE, "command": "/gpu", "text": "status"}
    try:
        local.wait_for_socket()
        assert {} == local.socket_send("slash_commands", envelope)
        assert said_hello.wait(5)
    finally:
        client.close()
    assert ("hello", 1, "A0GPUBOT") == (
        hello[0]["type"],
        hello[0]["num_connections"],
        hello[0]["connection_info"]["app_id"],
    )
    assert "Bearer " + APP_TOKEN == local.wait_for("apps.connections.open").headers["authorization"]
    assert [("slash_commands", True, envelope)] == [
        (r.type, r.accepts_response_payload, r.payload) for r in answered
    ]


@pytest.fixture
def bolt_over_socket(local: LocalSlack) -> Iterator[App]:
    """A tiny Bolt app whose /gpu answers "pong <text>", connected through Socket Mode."""
    app = App(client=WebClient(token=BOT_TOKEN, base_url=local.api_url))

    @app.command("/gpu")
    def pong(ack: Ack, command: dict[str, Any]) -> None:
        ack(f"pong {command['text']}")

    handler = SocketModeHandler(app, APP_TOKEN)
    handler.connect()  # type: ignore[no-untyped-call]  # Bolt leaves it unannotated
    local.wait_for_socket()
    yield app
    handler.close()  # type: ignore[no-untyped-call]


def test_bolt_acks_an_envelope_with_its_payload(local: LocalSlack, bolt_over_socket: App) -> None:
    """Bolt puts ack(...) into the ack frame's payload."""
    form = payloads.slash_command(
        ALICE,
        "ping",
        response_url=payloads.fresh_response_url(local, "C0GPU", ALICE),
        trigger_id=payloads.fresh_trigger_id(local, ALICE),
    )
    assert {"text": "pong ping"} == local.socket_send("slash_commands", form)


def test_a_long_ack_crosses_the_socket(local: LocalSlack, bolt_over_socket: App) -> None:
    """Acks above 125 and 65535 bytes use the longer length encodings."""
    driver = SlackDriver(local, SocketTransport(local))
    reply = driver.command(ALICE, "x" * 70_000)
    assert "pong " + "x" * 70_000 == reply.text


def test_the_driver_shows_a_socket_ack_as_an_ephemeral(
    local: LocalSlack, bolt_over_socket: App
) -> None:
    """Like Slack, the ack text appears to the invoker only."""
    reply = SlackDriver(local, SocketTransport(local)).command(ALICE, "status")
    assert (200, "pong status") == (reply.status, reply.text)
    assert ["pong status"] == [e.text for e in local.ephemerals(ALICE, "C0GPU")]


def test_an_unhandled_request_gets_no_ack(local: LocalSlack, bolt_over_socket: App) -> None:
    """Bolt acks nothing no listener handled: socket_send times out, the driver reports 0."""
    event = payloads.event_callback({"type": "reaction_added", "user": ALICE})
    assert 0 == SlackDriver(local, SocketTransport(local, timeout=0.3)).event(event).status
    unhandled = payloads.slash_command(ALICE, "x", command="/other", response_url="", trigger_id="")
    with pytest.raises(TimeoutError, match="no ack"):
        local.socket_send("slash_commands", unhandled, timeout=0.3)
