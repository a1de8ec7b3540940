"""Acks first: the work after an ack starts once the requests being acked are answered."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import urlencode

from slack_bolt import Ack, App
from slack_sdk import WebClient

from bot.server import EVENTS_PATH, SlackAsgi
from bot.slack.acks import AcksFirst
from bot.slack.localapi import BOT_TOKEN, LocalSlack, payloads, sign


def _waiter(acks: AcksFirst, started: list[str]) -> threading.Thread:
    def wait() -> None:
        acks.wait_turn()
        started.append("work")

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def test_with_nothing_being_acked_work_starts_at_once() -> None:
    acks = AcksFirst(quiet_s=60, longest_s=60)
    assert acks.wait_turn() < 60  # never acked anything: no burst to wait out


def test_work_waits_for_the_ack_in_flight_and_then_the_quiet() -> None:
    acks = AcksFirst(quiet_s=0.05, longest_s=30)
    order: list[str] = []
    with acks.acking():
        thread = _waiter(acks, order)
        thread.join(0.2)
        assert thread.is_alive(), "work started while a request was still being acked"
        order.append("acked")
    thread.join(10)
    assert order == ["acked", "work"]
    assert acks.in_flight == 0


def test_a_stream_of_requests_delays_work_by_at_most_longest() -> None:
    acks = AcksFirst(quiet_s=30, longest_s=0.1)
    with acks.acking():  # never ends while the work waits
        order: list[str] = []
        thread = _waiter(acks, order)
        thread.join(10)
        assert order == ["work"]
        assert acks.in_flight == 1


def test_a_failed_dispatch_still_counts_as_done() -> None:
    acks = AcksFirst(quiet_s=0, longest_s=30)
    try:
        with acks.acking():
            raise RuntimeError("dispatch failed")
    except RuntimeError:
        pass
    assert acks.in_flight == 0
    order: list[str] = []
    _waiter(acks, order).join(10)
    assert order == ["work"]


def test_the_http_front_counts_each_slack_request_until_its_ack_is_sent() -> None:
    acks = AcksFirst()
    secret = "not-a-secret"  # noqa: S105
    with LocalSlack() as local:
        client = WebClient(token=BOT_TOKEN, base_url=local.api_url)
        assert _dispatched(App(client=client, signing_secret=secret), acks, secret) == 200
    assert acks.in_flight == 0


def _dispatched(app: App, acks: AcksFirst, secret: str) -> int:
    seen: list[int] = []

    @app.command("/gpu")
    def gpu(ack: Ack) -> None:
        seen.append(acks.in_flight)
        ack()

    body = urlencode(
        payloads.slash_command(
            "U0ALICE01",
            "help",
            response_url="https://hooks.slack.invalid/commands/1",
            trigger_id="1.2.3",
        )
    ).encode()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    headers = [(k.lower().encode(), v.encode()) for k, v in sign(body, secret).items()]
    scope = {"type": "http", "path": EVENTS_PATH, "method": "POST", "headers": headers}
    asyncio.run(SlackAsgi(app, lambda: {"ok": True}, acks=acks)(scope, receive, send))
    assert seen == [1]
    return int(sent[0]["status"])
