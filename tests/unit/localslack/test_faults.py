"""Injected faults against slack_sdk's own retry handlers: 429, 500 and slow answers."""

from __future__ import annotations

from typing import cast

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator

from bot.localslack import BOT_TOKEN, LocalSlack


def test_a_rate_limit_is_retried_and_posts_once(local: LocalSlack) -> None:
    """429 with Retry-After 0, then the retry goes through: exactly one message."""
    local.faults.add("chat.postMessage", status=429, retry_after=0)
    client = WebClient(
        token=BOT_TOKEN, base_url=local.api_url, retry_handlers=[RateLimitErrorRetryHandler()]
    )
    client.chat_postMessage(channel="C0GPU", text="once")
    assert ["once"] == [m.text for m in local.messages("C0GPU")]
    calls = local.calls.of("chat.postMessage")
    assert [(True, 429), (False, 200)] == [(c.faulted, c.status) for c in calls]
    assert {"ok": False, "error": "ratelimited"} == calls[0].response


def test_a_rate_limit_without_a_retry_handler_reaches_the_app(
    client: WebClient, local: LocalSlack
) -> None:
    """The 429 surfaces as ratelimited and nothing is posted."""
    local.faults.add("chat.postMessage", retry_after=7)
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0GPU", text="lost")
    assert (429, "7") == (
        refused.value.response.status_code,
        refused.value.response.headers["Retry-After"],
    )
    assert [] == local.messages("C0GPU")


def test_a_server_error_is_retried(local: LocalSlack) -> None:
    """500 internal_error, retried by ServerErrorRetryHandler."""
    local.faults.add("chat.postMessage", status=500)
    handler = ServerErrorRetryHandler(interval_calculator=FixedValueRetryIntervalCalculator(0))
    client = WebClient(token=BOT_TOKEN, base_url=local.api_url, retry_handlers=[handler])
    client.chat_postMessage(channel="C0GPU", text="after a 500")
    assert ["after a 500"] == [m.text for m in local.messages("C0GPU")]
    faulted = local.calls.of("chat.postMessage")[0]
    assert (500, "internal_error") == (faulted.status, faulted.response["error"])


def test_faults_count_down(client: WebClient, local: LocalSlack) -> None:
    """times=2 faults two calls; the third is answered normally; other methods are untouched."""
    local.faults.add("chat.postMessage", status=503, error="service_unavailable", times=2)
    for _ in range(2):
        with pytest.raises(SlackApiError):
            client.chat_postMessage(channel="C0GPU", text="x")
    client.auth_test()
    client.chat_postMessage(channel="C0GPU", text="third")
    assert ["third"] == [m.text for m in local.messages("C0GPU")]
    assert [] == local.faults.pending()


def test_a_slow_answer_times_the_client_out_but_the_work_happens(local: LocalSlack) -> None:
    """A delay-only fault is a slow Slack: the client gives up, the message still lands."""
    local.faults.add("chat.postMessage", delay=0.6)
    # slack_sdk annotates timeout as int but hands it to urllib, which takes fractions.
    timeout = cast(int, 0.2)
    client = WebClient(token=BOT_TOKEN, base_url=local.api_url, timeout=timeout, retry_handlers=[])
    with pytest.raises(TimeoutError):
        client.chat_postMessage(channel="C0GPU", text="slow")
    call = local.wait_for("chat.postMessage", timeout=5)
    assert ("slow", False) == (call.args["text"], call.faulted)
    assert ["slow"] == [m.text for m in local.messages("C0GPU")]


def test_a_slow_error_changes_nothing(local: LocalSlack) -> None:
    """A delayed 500 is a fault: recorded, no state change."""
    local.faults.add("chat.postMessage", status=500, delay=0.1)
    client = WebClient(token=BOT_TOKEN, base_url=local.api_url, retry_handlers=[])
    with pytest.raises(SlackApiError):
        client.chat_postMessage(channel="C0GPU", text="never")
    assert [] == local.messages("C0GPU")
    assert [True] == [call.faulted for call in local.calls.of("chat.postMessage")]
