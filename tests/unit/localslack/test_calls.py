"""Waiting for a call instead of sleeping: listener work arrives after the ack, on other threads."""

from __future__ import annotations

import threading

import pytest
from slack_sdk import WebClient

from bot.localslack import LocalSlack


def test_wait_for_returns_a_call_made_later_on_another_thread(
    client: WebClient, local: LocalSlack
) -> None:
    """The waiter wakes when the call is recorded, after the workspace changed."""
    later = threading.Timer(0.1, lambda: client.chat_postMessage(channel="C0GPU", text="late"))
    later.start()
    call = local.wait_for("chat.postMessage", lambda args: args["text"] == "late")
    later.join()
    assert "late" == call.args["text"]
    assert ["late"] == [m.text for m in local.messages("C0GPU")]


def test_wait_for_finds_calls_already_made(client: WebClient, local: LocalSlack) -> None:
    """A call that came before the wait still counts; the predicate picks among several."""
    for text in ("first", "second"):
        client.chat_postMessage(channel="C0GPU", text=text)
    assert (
        "second" == local.wait_for("chat.postMessage", lambda a: a["text"] == "second").args["text"]
    )


def test_wait_for_times_out_naming_what_it_saw(client: WebClient, local: LocalSlack) -> None:
    """A TimeoutError says which calls did arrive."""
    client.auth_test()
    with pytest.raises(TimeoutError, match=r"no matching chat\.update call .* saw: auth\.test"):
        local.wait_for("chat.update", timeout=0.1)


def test_wait_for_skips_faulted_calls(client: WebClient, local: LocalSlack) -> None:
    """A call a fault answered never reached the workspace."""
    local.faults.add("auth.test")
    with pytest.raises(Exception, match="ratelimited"):
        client.auth_test()
    with pytest.raises(TimeoutError):
        local.wait_for("auth.test", timeout=0.1)
