"""bot.foreground: a pass gives way to the requests being served, never for longer than asked."""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any, cast

import pytest
from slack_bolt import App

from bot import foreground
from bot.server import AGENT_PATH, Background, SlackAsgi


def test_give_way_returns_at_once_when_nothing_is_served() -> None:
    """With no request in flight a pass loses no time."""
    started = time.perf_counter()
    foreground.give_way(5.0)
    assert time.perf_counter() - started < 1.0


def test_give_way_waits_until_the_request_is_answered() -> None:
    """A pass resumes once the request in flight is answered, not after its whole allowance."""
    entered, leave = threading.Event(), threading.Event()

    def request() -> None:
        with foreground.serving():
            entered.set()
            leave.wait(5.0)

    serving = threading.Thread(target=request)
    serving.start()
    assert entered.wait(5.0)
    threading.Timer(0.05, leave.set).start()
    started = time.perf_counter()
    with foreground.in_background():
        foreground.give_way(10.0)
    waited = time.perf_counter() - started
    serving.join()
    assert 0.04 < waited < 5.0


def test_give_way_waits_no_longer_than_asked() -> None:
    """A request that never ends cannot stop a pass: it moves on after `most_s`."""
    with foreground.serving(), foreground.in_background():
        started = time.perf_counter()
        foreground.give_way(0.05)
        waited = time.perf_counter() - started
    assert 0.04 < waited < 5.0


def test_served_requests_are_counted_across_threads() -> None:
    """The pass waits while any request is served, until the last one is answered."""
    with foreground.in_background():
        with foreground.serving():
            with foreground.serving():
                pass
            started = time.perf_counter()
            foreground.give_way(0.05)
            assert time.perf_counter() - started >= 0.04
        started = time.perf_counter()
        foreground.give_way(5.0)
        assert time.perf_counter() - started < 1.0


def test_give_way_outside_a_pass_returns_at_once() -> None:
    """Only a pass gives way: a thread running none (a page, a command) is never held up."""
    with foreground.serving():
        started = time.perf_counter()
        foreground.give_way(5.0)
        assert time.perf_counter() - started < 1.0


def test_a_pass_waits_no_longer_in_all_than_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests that never stop coming cannot stall a pass: after its first wait, it gives
    way at most SHARE times as long as it has worked."""
    monkeypatch.setattr(foreground, "SHARE", 1)
    with foreground.serving(), foreground.in_background():
        started = time.perf_counter()
        foreground.give_way(0.2)  # the first wait: the whole allowance
        assert time.perf_counter() - started >= 0.19
        busy = time.perf_counter()
        while time.perf_counter() - busy < 0.05:  # 50 ms of work
            pass
        started = time.perf_counter()
        for _ in range(100):
            foreground.give_way(0.2)
        assert time.perf_counter() - started < 0.1 * foreground.SHARE  # not 100 x 0.2 s


def test_a_pass_shortens_the_switch_interval_until_the_last_one_ends() -> None:
    """The interval is short while any pass runs and back to what it was after the last."""
    before = sys.getswitchinterval()
    with foreground.in_background():
        assert sys.getswitchinterval() == pytest.approx(min(foreground.SWITCH_S, before))
        with foreground.in_background():
            pass
        assert sys.getswitchinterval() == pytest.approx(min(foreground.SWITCH_S, before))
    assert sys.getswitchinterval() == before


def test_the_switch_interval_comes_back_after_a_failed_pass() -> None:
    """A pass that raises leaves the interpreter as it found it."""
    before = sys.getswitchinterval()
    try:
        with foreground.in_background():
            raise RuntimeError("the pass failed")
    except RuntimeError:
        pass
    assert sys.getswitchinterval() == before


class _HeldIngest:
    """Stands in for the agent ingest: answers each push once told to."""

    def __init__(self) -> None:
        self.entered, self.leave = threading.Event(), threading.Event()

    def handle(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        self.entered.set()
        self.leave.wait(5.0)
        return 200, '{"ok": true}'

    handle_results = handle


def test_the_front_serves_an_agent_push_before_a_pass() -> None:
    """From its arrival to its answer, an agent's push has a pass give way to it."""
    ingest = _HeldIngest()
    app = App(signing_secret="front", token="xoxb-front", token_verification_enabled=False)
    http = Background(SlackAsgi(app, lambda: {"ok": True}, ingest=cast(Any, ingest)))
    answers: list[int] = []

    def push() -> None:
        url = http.url + AGENT_PATH  # http://127.0.0.1:port: loopback, no other scheme
        request = urllib.request.Request(url, data=b"{}", method="POST")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            answers.append(answer.status)

    sender = threading.Thread(target=push)
    try:
        sender.start()
        assert ingest.entered.wait(5.0)
        with foreground.in_background():
            started = time.perf_counter()
            foreground.give_way(0.05)
            assert time.perf_counter() - started >= 0.04
            ingest.leave.set()
            sender.join(10.0)
            assert answers == [200]
            started = time.perf_counter()
            foreground.give_way(5.0)
            assert time.perf_counter() - started < 1.0
    finally:
        ingest.leave.set()
        http.stop()


def test_a_push_whose_body_stalls_holds_no_pass_up() -> None:
    """A sender that stops mid-body is not being served: a pass does not wait on it."""
    ingest = _HeldIngest()
    app = App(signing_secret="front", token="xoxb-front", token_verification_enabled=False)
    http = Background(SlackAsgi(app, lambda: {"ok": True}, ingest=cast(Any, ingest)))
    host, port = http.url.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)), timeout=10)
    try:
        stalled.sendall(
            f"POST {AGENT_PATH} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000\r\n\r\n{{".encode()
        )
        time.sleep(0.2)  # the front has the head and one byte of the body
        with foreground.in_background():
            started = time.perf_counter()
            foreground.give_way(2.0)
            assert time.perf_counter() - started < 1.0
        assert not ingest.entered.is_set()
    finally:
        stalled.close()
        ingest.leave.set()
        http.stop()
