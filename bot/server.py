"""The HTTP front in HTTP mode: Slack's /slack/events for commands, interactivity and events,
/livez, /readyz and /healthz, GET /metrics (with `metrics`), and (with an `ingest`) the node
agents' POST /agent/samples and /agent/results, as one small ASGI app. In Socket Mode, which has
no HTTP server, `MetricsPort` serves /metrics and the probes on a port of their own. On a
follower replica the agents' requests go on to the leader (`forward`: bot.forward).

Every request to /slack/events is checked on its raw bytes before it is parsed (signature and
timestamp, then encoding and shape: bot.slack.wire); what fails is refused with 400/401 and
counted, with at most one log line per reason a minute, never a traceback. Bolt's dispatch is
synchronous, so it runs in a worker thread: one slow request never holds up the others' acks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from pydantic import SecretStr
from slack_bolt import App, BoltContext
from slack_bolt.request import BoltRequest
from slack_bolt.request.internals import build_context

from bot import foreground
from bot import metrics as prometheus
from bot.slack import wire
from bot.telemetry.refusals import Refusals

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from bot.forward import Forwarder
    from bot.telemetry.agent_push import Ingest

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Health = Callable[[], dict[str, Any]]
AgentHandler = Callable[[Mapping[str, str], bytes], tuple[int, str]]

EVENTS_PATH = "/slack/events"
AGENT_PATH = "/agent/samples"
RESULTS_PATH = "/agent/results"
METRICS_PATH = "/metrics"
AGENT_THREADS = 16  # agents' requests handled at once
MAX_BODY = 1 << 20  # Slack's payloads are far smaller; anything bigger is not Slack
TEXT = {"content-type": "text/plain; charset=utf-8"}
JSON_TYPE = {"content-type": "application/json"}


@dataclass(frozen=True)
class MetricsAccess:
    """What /metrics serves, and the bearer token it asks for (None: it is open)."""

    registry: CollectorRegistry
    token: SecretStr | None = None

    def answer(self, authorization: str | None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one GET /metrics (it reads the database: call it off the
        event loop)."""
        token = self.token.get_secret_value() if self.token is not None else None
        if not prometheus.allowed(authorization, token):
            challenge = {**TEXT, "www-authenticate": 'Bearer realm="gpubot metrics"'}
            return 401, challenge, b"/metrics needs Authorization: Bearer <GPUBOT_METRICS_TOKEN>"
        return 200, {"content-type": prometheus.CONTENT_TYPE}, prometheus.scrape(self.registry)


class SlackAsgi:
    """POST /slack/events -> the Bolt app; GET /livez, /readyz, /healthz; GET /metrics when
    `metrics` is given; POST /agent/samples and /agent/results -> `ingest` when one is given;
    everything else 404."""

    def __init__(
        self,
        app: App,
        health: Health,
        *,
        signing_secret: str | None = None,
        ingest: Ingest | None = None,
        ready: Health | None = None,
        on_shutdown: Callable[[], None] | None = None,
        metrics: MetricsAccess | None = None,
        forward: Forwarder | None = None,
    ) -> None:
        self.app = app
        self.forward = forward
        self.metrics = metrics
        self.on_shutdown = on_shutdown
        self.health = health
        self.ready = ready or health
        self.ingest = ingest
        # By default the secret Bolt itself verifies with (it keeps it without an accessor).
        self.signing_secret = signing_secret or str(getattr(app, "_signing_secret", "") or "")
        self.refused = Refusals(lambda: datetime.now(UTC), subject=f"a request to {EVENTS_PATH}")
        # Each dispatch holds its thread until the listener acks; asyncio's default pool (a
        # handful of threads on small machines) would queue requests behind slow acks.
        self._dispatch = ThreadPoolExecutor(max_workers=32, thread_name_prefix="slack-dispatch")
        # The agents' requests have threads of their own: at hundreds a second, each waiting on
        # its nonce's commit, they would fill asyncio's default pool and queue behind each other
        # (and the more wait together, the more nonces one commit records).
        self._agents = ThreadPoolExecutor(max_workers=AGENT_THREADS, thread_name_prefix="agent")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, self.on_shutdown)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == EVENTS_PATH and method == "POST":
            await self._events(scope, receive, send)
            return
        if path in (AGENT_PATH, RESULTS_PATH) and method == "POST" and self.ingest is not None:
            handle = self.ingest.handle if path == AGENT_PATH else self.ingest.handle_results
            await self._agent(scope, receive, send, handle)
            return
        if method in ("GET", "HEAD") and path in ("/livez", "/readyz", "/healthz"):
            await self._probe(path, send)
            return
        if path == METRICS_PATH and self.metrics is not None:
            await self._metrics(self.metrics, scope, method, send)
            return
        await _answer(send, 404, TEXT, b"not found")

    async def _probe(self, path: str, send: Send) -> None:
        if path == "/livez":  # the process answers: a database outage must not restart it
            report: dict[str, Any] = {"ok": True}
        else:
            check = self.health if path == "/healthz" else self.ready
            try:
                report = await asyncio.to_thread(check)
            except Exception:
                log.exception("%s failed", path)
                report = {"ok": False}
            if path == "/healthz":
                report["refused"] = self.refused.totals()
                if self.ingest is not None:
                    report["agent_refused"] = self.ingest.refusals.totals()
                if self.forward is not None:
                    report["agent_forwarding"] = self.forward.totals()
        status = 200 if report.get("ok") else 503
        await _answer(send, status, JSON_TYPE, json.dumps(report).encode())

    async def _metrics(self, metrics: MetricsAccess, scope: Scope, method: str, send: Send) -> None:
        if method != "GET":
            await _answer(send, 405, {**TEXT, "allow": "GET"}, b"/metrics answers GET only")
            return
        authorization = _single_headers(scope).get("authorization")
        try:
            status, headers, body = await asyncio.to_thread(metrics.answer, authorization)
        except Exception:  # a bug in a collector: one traceback, and the scrape fails visibly
            log.exception("%s failed", METRICS_PATH)
            status, headers, body = 500, TEXT, b"internal error"
        await _answer(send, status, headers, body)

    async def _events(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _single_headers(scope)
        body = await _body(receive, headers)
        if body is None:
            self.refused.refused("too-large", "", 413, "too-large", "body too large")
            await _answer(send, 413, TEXT, b"payload too large")
            return
        refusal = wire.verify(self.signing_secret, headers, body, time.time())
        checked = refusal or wire.check(body, headers.get("content-type", ""))
        if isinstance(checked, wire.Refusal):
            reason = checked.reason.replace(" ", "-")
            self.refused.refused(reason, "", checked.status, reason, checked.reason)
            words = {401: b"invalid request", 404: b"unhandled request"}
            await _answer(send, checked.status, TEXT, words.get(checked.status, b"bad request"))
            return
        try:
            request = bolt_request(
                checked,
                headers=_headers(scope),
                query=scope.get("query_string", b"").decode("latin-1"),
            )
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            # Signed, shaped as checked, and still more than Bolt can read: refused all the same.
            self.refused.refused("unreadable", "", 400, "unreadable", type(exc).__name__)
            await _answer(send, 400, TEXT, b"malformed request")
            return
        loop = asyncio.get_running_loop()
        try:
            response = await loop.run_in_executor(self._dispatch, self.app.dispatch, request)
        except Exception:
            log.exception("dispatching a Slack request failed")
            await _answer(send, 500, TEXT, b"internal error")
            return
        if response.status == 404:  # signed and well formed, but nothing here takes it
            self.refused.refused("unhandled", "", 404, "unhandled", "no listener takes it")
        answered = {k: ", ".join(v) for k, v in response.headers.items()}
        await _answer(send, response.status, answered, response.body.encode("utf-8"))

    async def _agent(
        self, scope: Scope, receive: Receive, send: Send, handle: AgentHandler
    ) -> None:
        headers = _single_headers(scope)
        body = await _body(receive, headers)
        if body is None:
            self.refused.refused("agent-too-large", "", 413, "agent-too-large", "body too large")
            await _answer(send, 413, TEXT, b"payload too large")
            return
        leader = self.forward.target(headers) if self.forward is not None else None
        if self.forward is not None and leader is not None:
            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(
                self.forward.pool, self.forward.send, leader, scope["path"], headers, body
            )
            if answer is not None:
                await _answer(
                    send, answer.status, {"content-type": answer.content_type}, answer.body
                )
                return
        # The passes over the fleet (the sweep) give way from the moment the whole push is in
        # until its answer is sent: its wait for a worker thread and the answer's send are
        # the interpreter's work too.
        with foreground.serving():
            try:
                loop = asyncio.get_running_loop()
                status, message = await loop.run_in_executor(self._agents, handle, headers, body)
            except Exception:  # the ingest answers every refusal itself; a bug, said once
                log.exception("an agent request failed")
                status, message = 400, "malformed request"
            # A 200 is the ingest's JSON answer (the orders ride on it); refusals are one line.
            kind = JSON_TYPE if status == 200 else TEXT
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


def _single_headers(scope: Scope) -> dict[str, str]:
    """Headers by lower-case name; a repeated one is joined, as HTTP says, so it can never
    match what was signed."""
    return {k: v if isinstance(v, str) else ", ".join(v) for k, v in _headers(scope).items()}


async def _body(receive: Receive, headers: Mapping[str, str]) -> bytes | None:
    """The whole body, or None past MAX_BODY (said up front or found while reading)."""
    declared = headers.get("content-length", "")
    if declared.isascii() and declared.isdecimal() and int(declared) > MAX_BODY:
        return None
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


async def _lifespan(
    receive: Receive, send: Send, on_shutdown: Callable[[], None] | None = None
) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if on_shutdown is not None:
                await asyncio.to_thread(on_shutdown)
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


class MetricsPortError(RuntimeError):
    """The metrics port cannot be listened on; the message says which and what to do."""


class MetricsPort:
    """GET /metrics, /healthz, /readyz and /livez on a port of their own, served by a thread:
    Socket Mode connects out to Slack and has no HTTP server for Prometheus to scrape."""

    def __init__(self, metrics: MetricsAccess, health: Health, ready: Health) -> None:
        self.handler = type(
            "Handler",
            (_MetricsHandler,),
            {"metrics": metrics, "health": staticmethod(health), "ready": staticmethod(ready)},
        )
        self.server: _Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        return None if self.server is None else int(self.server.server_address[1])

    def listen(self, host: str, port: int | None, *, beside: int | None = None) -> None:
        """Serve on `port` (0: any free one); nothing when it is None or is `beside`, the HTTP
        port, which serves /metrics itself. Raises MetricsPortError when it is taken."""
        if port is None or port == beside:
            return
        server_class = _Server6 if ":" in host else _Server
        try:
            self.server = server_class((host, port), self.handler)
        except OSError as exc:
            raise MetricsPortError(
                f"cannot listen on {host}:{port} for /metrics ({exc.strerror or exc}): is "
                "another gpubot running there? Choose another --metrics-port "
                "(GPUBOT_METRICS_PORT)."
            ) from None
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="gpubot-metrics", daemon=True
        )
        self.thread.start()
        log.info("gpubot: /metrics on %s:%s", host, self.port)

    def stop(self) -> None:
        if self.server is None or self.thread is None:
            return
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
        self.server = self.thread = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a scrape in flight never holds up the process's exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _MetricsHandler(BaseHTTPRequestHandler):
    metrics: MetricsAccess
    health: Health
    ready: Health
    server_version = "gpubot"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            try:
                status, headers, body = self.metrics.answer(self.headers.get("authorization"))
            except Exception:  # a bug in a collector: one traceback, and the scrape fails
                log.exception("%s failed", METRICS_PATH)
                status, headers, body = 500, TEXT, b"internal error"
        elif path in ("/livez", "/readyz", "/healthz"):
            status, headers, body = self._probe(path)
        else:
            status, headers, body = 404, TEXT, b"not found"
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _probe(self, path: str) -> tuple[int, dict[str, str], bytes]:
        if path == "/livez":
            report: Mapping[str, Any] = {"ok": True}
        else:
            try:
                report = (self.health if path == "/healthz" else self.ready)()
            except Exception:
                log.exception("%s failed", path)
                report = {"ok": False}
        return 200 if report.get("ok") else 503, JSON_TYPE, json.dumps(report).encode()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: Prometheus scrapes every few seconds, and a line each would drown the log."""
