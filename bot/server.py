"""The HTTP front in HTTP mode: Slack's /slack/events for commands, interactivity and events,
/healthz, and (with an `ingest`) the node agents' POST /agent/samples and /agent/results, as
one small ASGI app.

Bolt's dispatch is synchronous (it returns once the listener called ack()), so it runs in a
worker thread: one slow request never holds up the event loop and the others' acks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from slack_bolt import App, BoltContext
from slack_bolt.request import BoltRequest
from slack_bolt.request.internals import build_context

if TYPE_CHECKING:
    from bot.slack.acks import AcksFirst
    from bot.telemetry.ingest import Ingest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Health = Callable[[], dict[str, Any]]
AgentHandler = Callable[[Mapping[str, str], bytes], tuple[int, str]]

EVENTS_PATH = "/slack/events"
AGENT_PATH = "/agent/samples"
RESULTS_PATH = "/agent/results"
MAX_BODY = 1 << 20  # Slack's payloads are far smaller; anything bigger is not Slack


class SlackAsgi:
    """POST /slack/events -> the Bolt app; GET /healthz -> health(); POST /agent/samples and
    /agent/results -> `ingest` when one is given; everything else 404."""

    def __init__(
        self,
        app: App,
        health: Health,
        *,
        ingest: Ingest | None = None,
        acks: AcksFirst | None = None,
    ) -> None:
        self.app = app
        self.acks = acks
        self.health = health
        self.ingest = ingest
        # Each dispatch holds its thread until the listener acks; asyncio's default pool (a
        # handful of threads on small machines) would queue requests behind slow acks.
        self._dispatch = ThreadPoolExecutor(max_workers=32, thread_name_prefix="slack-dispatch")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == EVENTS_PATH and method == "POST":
            if self.acks is None:
                await self._events(scope, receive, send)
            else:
                with self.acks.acking():  # the work after earlier acks waits for this one
                    await self._events(scope, receive, send)
            return
        if path == AGENT_PATH and method == "POST" and self.ingest is not None:
            await self._agent(scope, receive, send, self.ingest.handle)
            return
        if path == RESULTS_PATH and method == "POST" and self.ingest is not None:
            await self._agent(scope, receive, send, self.ingest.handle_results)
            return
        if path == "/healthz" and method in ("GET", "HEAD"):
            report = await asyncio.to_thread(self.health)
            status = 200 if report.get("ok") else 503
            payload = json.dumps(report).encode()
            await _answer(send, status, {"content-type": "application/json"}, payload)
            return
        await _answer(send, 404, {"content-type": "text/plain"}, b"not found")

    async def _events(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _body(receive)
        if body is None:
            await _answer(send, 413, {"content-type": "text/plain"}, b"payload too large")
            return
        request = bolt_request(
            body.decode("utf-8"),
            headers=_headers(scope),
            query=scope.get("query_string", b"").decode("latin-1"),
        )
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(self._dispatch, self.app.dispatch, request)
        headers = {k: ", ".join(v) for k, v in response.headers.items()}
        await _answer(send, response.status, headers, response.body.encode("utf-8"))

    async def _agent(
        self, scope: Scope, receive: Receive, send: Send, handle: AgentHandler
    ) -> None:
        body = await _body(receive)
        text = {"content-type": "text/plain; charset=utf-8"}
        if body is None:
            await _answer(send, 413, text, b"payload too large")
            return
        # A repeated header is joined, as HTTP says, so it can never match what was signed.
        headers = {k: v if isinstance(v, str) else ", ".join(v) for k, v in _headers(scope).items()}
        status, message = await asyncio.to_thread(handle, headers, body)
        # A 200 is the ingest's JSON answer (the orders ride on it); refusals are one line.
        kind = {"content-type": "application/json"} if status == 200 else text
        await _answer(send, status, kind, message.encode("utf-8"))


def bolt_request(
    body: str, *, headers: Mapping[str, str | Sequence[str]], query: str = ""
) -> BoltRequest:
    """Bolt's request for a signed body, parsed right.

    Bolt reads any form body that merely contains the word "payload" as an interaction and
    finds none, so `/gpu borrow 1 a100 because payload tests` would go unanswered; such a slash
    command is parsed again as the form it is (the raw body, and so the signature, untouched)."""
    request = BoltRequest(body=body, query=query, headers=dict(headers))
    if not request.body and "payload" in body and not body.lstrip().startswith("{"):
        form = dict(parse_qsl(body, keep_blank_values=True))
        if "payload" not in form:
            request.body = form
            request.context = build_context(BoltContext({}), form)
    return request


def _headers(scope: Scope) -> dict[str, str | Sequence[str]]:
    out: dict[str, list[str]] = {}
    for raw_name, raw_value in scope.get("headers", []):
        out.setdefault(raw_name.decode("latin-1").lower(), []).append(raw_value.decode("latin-1"))
    return dict(out)


async def _body(receive: Receive) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, status: int, headers: dict[str, str], body: bytes) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Background:
    """An ASGI app served by uvicorn on a free loopback port, in a thread (the demo, tests)."""

    def __init__(self, asgi: Any, *, name: str = "gpubot-http", timeout: float = 10.0) -> None:
        import uvicorn  # noqa: PLC0415 - only serving needs the server

        self.port = free_port()
        config = uvicorn.Config(
            asgi, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.server.should_exit = True
                raise RuntimeError(f"{name}: the HTTP server did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
