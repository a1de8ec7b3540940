"""`LocalSlack`: the local Slack Web API, response_urls, uploads and Socket Mode on one HTTP port.

with LocalSlack() as local:
    WebClient(token=BOT_TOKEN, base_url=local.api_url).chat_postMessage(channel="C0GPU", text="hi")
    local.wait_for("chat.postMessage")
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from traceback import format_exc
from types import TracebackType
from typing import Any

from .api import Answer, WebApi
from .api_chat import METHODS as CHAT_METHODS
from .api_misc import METHODS as MISC_METHODS
from .api_views import METHODS as VIEWS_METHODS
from .calls import Call, CallLog, Predicate
from .faults import Faults
from .model import JSON, Ephemeral, Message
from .responses import respond
from .socket import SocketMode
from .workspace import Workspace

BOT_TOKEN, APP_TOKEN = "xoxb-local-gpubot", "xapp-local-gpubot"
METHODS = CHAT_METHODS | VIEWS_METHODS | MISC_METHODS


class LocalSlack:
    """A Slack workspace on 127.0.0.1 that records every call; `start()` binds it (port 0: any)."""

    def __init__(
        self,
        workspace: Workspace | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bot_token: str = BOT_TOKEN,
        app_token: str = APP_TOKEN,
    ) -> None:
        self.workspace = workspace or Workspace.default()
        self.host, self.port = host, port
        self.calls, self.faults = CallLog(), Faults()
        self._stopping = threading.Event()
        self.api = WebApi(
            self.workspace,
            METHODS,
            bot_token=bot_token,
            app_token=app_token,
            calls=self.calls,
            faults=self.faults,
            stopping=self._stopping,
        )
        self.socket = SocketMode(self.workspace.app_id)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> LocalSlack:
        server = _Server((self.host, self.port), _handler(self))
        self._server, self.port = server, server.server_address[1]
        self.api.base_url = self.base_url
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="local-slack", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()
        self.socket.hang_up()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> LocalSlack:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT/ (known once started)."""
        if self._server is None:
            raise RuntimeError("LocalSlack is not started")
        return f"http://{self.host}:{self.port}/"

    @property
    def api_url(self) -> str:
        """What a WebClient's base_url (and SLACK_API_URL) should be."""
        return self.base_url + "api/"

    def response_url(self, token: str) -> str:
        return f"{self.base_url}response/{token}"

    # what tests look at

    @property
    def violations(self) -> list[str]:
        """Every breach of Slack's contract seen so far (limits, missing fallbacks, bad methods)."""
        return self.api.violations

    def wait_for(
        self, method: str, predicate: Predicate | None = None, timeout: float = 5.0
    ) -> Call:
        return self.calls.wait_for(method, predicate, timeout)

    def messages(self, channel: str) -> list[Message]:
        """The messages in a channel (by id or name, or a person's DM by user id), oldest first."""
        found = self.workspace.channel(channel)
        return self.workspace.messages(found.id) if found else []

    def last_message(self, channel: str) -> Message | None:
        messages = self.messages(channel)
        return messages[-1] if messages else None

    def dm_channel(self, user: str) -> str:
        return self.workspace.dm_channel(user)

    def ephemerals(self, user: str, channel: str | None = None) -> list[Ephemeral]:
        return self.workspace.ephemerals(user, channel)

    def home(self, user: str) -> JSON | None:
        return self.workspace.views.home(user)

    def modals(self, user: str) -> list[JSON]:
        return self.workspace.views.modals(user)

    def reset(self) -> None:
        """Back to the seeded workspace: no messages, calls, faults or violations."""
        self.workspace.reset()
        self.calls.clear()
        self.faults.clear()
        with self.workspace.lock:
            self.api.violations.clear()

    # Socket Mode

    def wait_for_socket(self, timeout: float = 5.0) -> None:
        self.socket.wait_connected(timeout)

    def socket_send(
        self, envelope_type: str, payload: dict[str, Any], timeout: float = 5.0
    ) -> dict[str, Any]:
        """Send an envelope to the connected app; the payload of its ack ({} if empty)."""
        return self.socket.send(envelope_type, payload, timeout)

    # the routes besides the Web API

    def _hook(
        self,
        method: str,
        headers: Mapping[str, str],
        act: Callable[[], tuple[int, str, JSON]],
        target: str = "",
    ) -> Answer:
        """A plain-text endpoint (response_url, upload) with faults and recording."""
        headers = {name.lower(): value for name, value in headers.items()}
        fault = self.faults.take(method)
        if fault is not None:
            self._stopping.wait(fault.delay)
            if fault.replaces_answer:
                status, body, extra = fault.answer()
                at = self.workspace.now()
                self.calls.record(Call(method, {}, headers, at, True, status, body, target))
                return Answer(status, str(body["error"]).encode(), extra)
        status, text, args = act()
        at = self.workspace.now()
        answered = {"ok": status == 200}
        self.calls.record(Call(method, args, headers, at, False, status, answered, target))
        return Answer.text(status, text)

    def _route(self, verb: str, path: str, headers: Mapping[str, str], raw: bytes) -> Answer:
        declared = next((v for k, v in headers.items() if k.lower() == "content-length"), "")
        if len(raw) < int(declared or 0):
            # The sender died mid-body (a bot killed while posting): Slack never acts on a
            # request it did not receive whole, so neither do we.
            return Answer.text(400, "incomplete_body")
        path, _, query = path.partition("?")
        if path.startswith("/api/"):
            return self.api.handle(path.removeprefix("/api/"), headers, raw, query)
        if verb == "POST" and path.startswith("/response/"):
            token = path.removeprefix("/response/")
            return self._hook(
                "response_url",
                headers,
                lambda: respond(self.workspace, token, raw, self.api.violate),
                token,
            )
        if verb == "POST" and path.startswith("/upload/"):
            file_id = path.removeprefix("/upload/")

            def upload() -> tuple[int, str, JSON]:
                stored = self.workspace.store_upload(file_id, raw)
                args = {"file_id": file_id, "length": len(raw)}
                return (200, f"OK - {len(raw)}", args) if stored else (404, "file_not_found", args)

            return self._hook("upload", headers, upload, file_id)
        if verb == "GET" and path.startswith("/files/"):
            return self._file(path, headers)
        return Answer.text(404, "not found")

    def _file(self, path: str, headers: Mapping[str, str]) -> Answer:
        """A shared file's bytes at its url_private, for the bot token only, as Slack serves it."""
        auth = {name.lower(): value for name, value in headers.items()}.get("authorization", "")
        if auth != f"Bearer {self.api.bot_token}":
            return Answer.text(403, "not_authed")
        file_id, _, _ = path.removeprefix("/files/").partition("/")
        file = self.workspace.file(file_id)
        if file is None or file.content is None or not file.completed:
            return Answer.text(404, "file_not_found")
        return Answer(200, file.content, {"Content-Type": file.mimetype})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # Slack takes bursts; the default backlog of 5 drops connections

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # a client that gave up is no news


def _handler(local: LocalSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "LocalSlack/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.split("?")[0].rstrip("/") == "/link":
                local.socket.serve(self)
                return
            self._route("GET", b"")

        def do_POST(self) -> None:
            self._route("POST", self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def _route(self, verb: str, raw: bytes) -> None:
            try:
                answer = local._route(verb, self.path, dict(self.headers), raw)
            except Exception:  # a bug here must reach the test, not vanish in a thread
                local.api.violate(f"local Slack failed on {verb} {self.path}: {format_exc()}")
                answer = Answer.json(500, {"ok": False, "error": "local_slack_bug"})
            self._answer(answer)

        def _answer(self, answer: Answer) -> None:
            try:
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
            except ConnectionError:
                self.close_connection = True  # the client timed out while we were slow

    return Handler
