"""Forwarding the node agents' requests from a follower replica to the leader: when it is done,
what goes on the wire, what comes back, and what happens when the leader does not answer.
The leader is a loopback HTTP server that records what it received; the address it is reached
at is kept in the leader table (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from slack_bolt import App

from bot.forward import FORWARDED, AdvertiseError, Answer, Forwarder, advertise_url
from bot.server import SlackAsgi, free_port
from storage import leader as rows
from storage.db import Database
from storage.tables import LeaderRow

BODY = b'{"samples": []}'
SIGNED = {
    "content-type": "application/json",
    "x-gpubot-node": "a100-node-01",
    "x-gpubot-timestamp": "1764669600",
    "x-gpubot-nonce": "n-1",
    "x-gpubot-signature": "v1=" + "ab" * 32,
    "user-agent": "gpubot-agent",
}
EVERYWHERE = "0.0.0.0"  # noqa: S104 - what `serve --host 0.0.0.0` passes on, never bound here
LEADER_ANSWER = b'{"ok": true, "taken": 0, "orders": []}'


@dataclass
class Elected:
    """The election as a follower sees it (bot.leader.Leader's surface)."""

    replicated: bool = True
    is_leader: bool = False
    leader_url: str | None = None


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class StubLeader:
    """A loopback leader: answers `status` and `body`, or never answers when `hang`."""

    status: int = 200
    body: bytes = LEADER_ANSWER
    hang: bool = False
    received: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def stub() -> Iterator[tuple[StubLeader, str]]:
    leader = StubLeader()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            leader.received.append(Received(self.path, headers, body))
            if leader.hang:
                leader.release.wait(10)
                return
            kind = "application/json" if leader.status == 200 else "text/plain; charset=utf-8"
            self.send_response(leader.status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(leader.body)))
            self.end_headers()
            self.wfile.write(leader.body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield leader, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        leader.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def forwarder(elected: Elected, clock: Clock | None = None, **kwargs: Any) -> Forwarder:
    return Forwarder(elected, own="http://10.0.0.8:3000", clock=clock or Clock(), **kwargs)


# ---- the decision --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elected", "headers", "expected"),
    [
        (Elected(leader_url="http://10.0.0.7:3000"), SIGNED, "http://10.0.0.7:3000"),
        (Elected(is_leader=True, leader_url=None), SIGNED, None),
        (Elected(replicated=False), SIGNED, None),
        (Elected(leader_url=None), SIGNED, None),
        (
            Elected(leader_url="http://10.0.0.7:3000"),
            {**SIGNED, FORWARDED: "http://10.0.0.9:3000"},
            None,
        ),
    ],
    ids=["follower", "leader", "sqlite", "no-leader-known", "forwarded-already"],
)
def test_only_a_follower_that_knows_the_leader_forwards_what_was_not_forwarded(
    elected: Elected, headers: dict[str, str], expected: str | None
) -> None:
    """A follower sends pushes on; the leader, a lone SQLite bot, a follower that knows no
    leader, and any replica a request was forwarded to take it themselves."""
    assert expected == forwarder(elected).target(headers)


def test_a_forwarded_request_is_counted_as_received() -> None:
    """What another replica sent on is taken here and counted, never sent on again."""
    forward = forwarder(Elected(leader_url="http://10.0.0.7:3000"))
    forward.target({**SIGNED, FORWARDED: "http://10.0.0.9:3000"})
    forward.target(SIGNED)
    assert {"forwarded": 0, "kept": 0, "unanswered": 0, "received": 1} == forward.totals()


# ---- on the wire ---------------------------------------------------------------------------


def test_the_raw_body_and_the_signature_go_to_the_leader_unchanged(
    stub: tuple[StubLeader, str],
) -> None:
    """The leader receives the same path, bytes and signed fields, marked as forwarded; the
    agent gets the leader's status, type and body back (its orders ride on it)."""
    leader, url = stub
    forward = forwarder(Elected(leader_url=url))
    answer = forward.send(url, "/agent/samples", SIGNED, BODY)
    assert Answer(200, "application/json", LEADER_ANSWER) == answer
    [got] = leader.received
    signed = {k: v for k, v in SIGNED.items() if k != "user-agent"}
    assert ("/agent/samples", BODY) == (got.path, got.body)
    assert signed == {k: got.headers[k] for k in signed}
    assert "http://10.0.0.8:3000" == got.headers[FORWARDED]
    assert 1 == forward.totals()["forwarded"]


def test_the_leaders_refusal_reaches_the_agent(stub: tuple[StubLeader, str]) -> None:
    """A replayed nonce refused by the leader is refused to the agent, word for word."""
    leader, url = stub
    leader.status, leader.body = 401, b"replayed request (nonce already used)"
    answer = forwarder(Elected(leader_url=url)).send(url, "/agent/results", SIGNED, BODY)
    assert Answer(401, "text/plain; charset=utf-8", leader.body) == answer


def test_an_unreachable_leader_leaves_the_pushes_here_for_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens at the leader's address: the push is taken here (None), and so are the
    next ones until the rest is over; one warning, not one per push."""
    url = f"http://127.0.0.1:{free_port()}"
    clock = Clock()
    forward = forwarder(Elected(leader_url=url), clock, rest_s=10.0)
    with caplog.at_level(logging.WARNING, logger="bot.forward"):
        assert forward.send(url, "/agent/samples", SIGNED, BODY) is None
        assert forward.target(SIGNED) is None
        clock.now += 11
        assert url == forward.target(SIGNED)
        assert forward.send(url, "/agent/samples", SIGNED, BODY) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert 1 == len(warnings)
    assert f"cannot reach the leader at {url}" in warnings[0]
    assert 3 == forward.totals()["kept"]


def test_a_leader_that_took_the_push_but_did_not_answer_is_not_doubled(
    stub: tuple[StubLeader, str],
) -> None:
    """The request reached the leader, which may have spent its nonce: the agent is told to
    push again (504, with a fresh nonce) instead of the push being taken here a second time."""
    leader, url = stub
    leader.hang = True
    forward = forwarder(Elected(leader_url=url), timeout_s=0.3)
    answer = forward.send(url, "/agent/samples", SIGNED, BODY)
    assert answer is not None
    assert 504 == answer.status
    assert {"forwarded": 0, "kept": 0, "unanswered": 1, "received": 0} == forward.totals()
    assert forward.target(SIGNED) is None  # resting: the agent's retry is taken here


def test_the_asgi_app_answers_a_follower_push_with_the_leaders_answer(
    stub: tuple[StubLeader, str],
) -> None:
    """Through the HTTP front: the follower's ingest never sees the push."""
    leader, url = stub

    class NoIngest:
        """An ingest that fails the test if the follower takes the push itself."""

        refusals = None

        def handle(self, headers: object, body: bytes) -> tuple[int, str]:
            raise AssertionError("the follower took a push it should have forwarded")

        handle_results = handle

    app = App(token="xoxb-test", signing_secret="not-a-secret", token_verification_enabled=False)
    asgi = SlackAsgi(
        app,
        lambda: {"ok": True},
        ingest=NoIngest(),  # type: ignore[arg-type]  # a stand-in that must not be called
        forward=forwarder(Elected(leader_url=url)),
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    raw = [(k.encode(), v.encode()) for k, v in SIGNED.items()]
    scope = {"type": "http", "path": "/agent/samples", "method": "POST", "headers": raw}
    asyncio.run(asgi(scope, receive, send))
    assert (200, LEADER_ANSWER) == (sent[0]["status"], sent[1]["body"])
    assert 1 == len(leader.received)


# ---- the advertised address ----------------------------------------------------------------


def test_the_advertised_url_is_the_setting_when_given() -> None:
    assert "http://gpubot-0.gpubot:3000" == advertise_url(
        "http://gpubot-0.gpubot:3000/", EVERYWHERE, 3000
    )


@pytest.mark.parametrize(
    "bad", ["10.0.0.7:3000", "ftp://10.0.0.7", "http://", "http://gpubot/" + "x" * 300]
)
def test_an_advertised_url_no_replica_could_use_is_refused_with_an_example(bad: str) -> None:
    with pytest.raises(AdvertiseError, match=r"http://10\.0\.0\.7:3000"):
        advertise_url(bad, EVERYWHERE, 3000)


def test_a_specific_host_is_advertised_as_it_is() -> None:
    assert "http://10.1.2.3:3000" == advertise_url(None, "10.1.2.3", 3000)
    assert "http://[fd00::7]:3000" == advertise_url(None, "fd00::7", 3000)


def test_listening_everywhere_advertises_this_hosts_address() -> None:
    """The pod's IP in Kubernetes: what this host's name resolves to."""
    expected = f"http://{socket.gethostbyname(socket.gethostname())}:3000"
    assert expected == advertise_url(None, EVERYWHERE, 3000)


# ---- where the leader's address is kept ------------------------------------------------------


def test_the_leader_row_carries_the_address_until_the_lead_is_given_up(
    database: Database,
) -> None:
    """Taking the lead records where the leader is reached; a clean hand-over clears it."""
    at = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    with database.write() as session:
        epoch = rows.take(
            session, "host:1:aaaa", at=at, ttl=timedelta(seconds=15), address="http://a:3000"
        )
        rows.here(session, "aaaa", at=at, ttl=timedelta(seconds=15), address="http://a:3000")
    with database.read() as session:
        held = rows.held(session)
        replica = session.get(LeaderRow, "replica:aaaa")
    assert held is not None
    assert replica is not None
    assert ("host:1:aaaa", "http://a:3000") == (held.holder, held.address)
    assert "http://a:3000" == replica.address
    with database.write() as session:
        rows.give_up(session, epoch, at=at)
    with database.read() as session:
        assert rows.held(session) is None
        row = session.get(LeaderRow, rows.JOBS)
        assert row is not None
        assert "" == row.address
