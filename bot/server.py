"""The HTTP front in HTTP mode: Slack's /slack/events for commands, interactivity and events,
and /healthz, as one small ASGI app that uvicorn serves.

Bolt's dispatch is synchronous (it returns once the listener called ack()), so it runs in a
worker thread: one slow request never holds up the event loop and the others' acks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from slack_bolt import App
from slack_bolt.request import BoltRequest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Health = Callable[[], dict[str, Any]]

EVENTS_PATH = "/slack/events"
MAX_BODY = 1 << 20  # Slack's payloads are far smaller; anything bigger is not Slack


class SlackAsgi:
    """POST /slack/events -> the Bolt app; GET /healthz -> health(); everything else 404."""

    def __init__(self, app: App, health: Health) -> None:
        self.app = app
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == EVENTS_PATH and method == "POST":
            body = await _body(receive)
            if body is None:
                await _answer(send, 413, {"content-type": "text/plain"}, b"payload too large")
                return
            request = BoltRequest(
                body=body.decode("utf-8"),
                query=scope.get("query_string", b"").decode("latin-1"),
                headers=_headers(scope),
            )
            response = await asyncio.to_thread(self.app.dispatch, request)
            headers = {k: ", ".join(v) for k, v in response.headers.items()}
            await _answer(send, response.status, headers, response.body.encode("utf-8"))
            return
        if path == "/healthz" and method in ("GET", "HEAD"):
            report = await asyncio.to_thread(self.health)
            status = 200 if report.get("ok") else 503
            payload = json.dumps(report).encode()
            await _answer(send, status, {"content-type": "application/json"}, payload)
            return
        await _answer(send, 404, {"content-type": "text/plain"}, b"not found")


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
