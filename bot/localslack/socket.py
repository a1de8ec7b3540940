"""Socket Mode: the app's WebSocket on `GET /link`, envelopes out, acks back.

`apps.connections.open` hands out `ws://127.0.0.1:PORT/link`; slack_sdk's built-in client speaks
plain ws:// to any port but 443, so the standard library is enough on this side.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Any

from .frames import CLOSE, PING, PONG, TEXT, accept_key, close_frame, encode, read_message

ENVELOPE_TYPES = ("slash_commands", "interactive", "events_api")
RESPONDING_INTERACTIONS = ("view_submission", "block_suggestion")


@dataclass
class _Link:
    """One connected app."""

    connection: socket.socket
    out: BufferedIOBase
    lock: threading.Lock = field(default_factory=threading.Lock)
    gone: threading.Event = field(default_factory=threading.Event)

    def send(self, frame: bytes) -> None:
        with self.lock:
            if self.gone.is_set():
                raise ConnectionError("the app has disconnected")
            self.out.write(frame)
            self.out.flush()

    def forget(self) -> None:
        """No more writes: the HTTP server is about to close this connection's files."""
        with self.lock:
            self.gone.set()

    def hang_up(self) -> None:
        try:
            self.send(close_frame(1001, "going away"))
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone


@dataclass
class _Pending:
    arrived: threading.Event = field(default_factory=threading.Event)
    payload: dict[str, Any] | None = None


class SocketMode:
    """Connected apps and the envelopes waiting for their acks."""

    def __init__(self, app_id: str, *, ping_interval_s: float = 0.2) -> None:
        self.app_id, self.ping_interval_s = app_id, ping_interval_s
        self._changed = threading.Condition()
        self._links: list[_Link] = []
        self._pending: dict[str, _Pending] = {}

    def serve(self, handler: BaseHTTPRequestHandler) -> None:
        """Complete the upgrade on this HTTP connection and serve it until the app leaves."""
        key = handler.headers.get("Sec-WebSocket-Key")
        if not key or handler.headers.get("Upgrade", "").lower() != "websocket":
            handler.send_error(400, "expected a WebSocket upgrade")
            return
        handler.send_response(101, "Switching Protocols")
        handler.send_header("Upgrade", "websocket")
        handler.send_header("Connection", "Upgrade")
        handler.send_header("Sec-WebSocket-Accept", accept_key(key))
        handler.end_headers()
        handler.close_connection = True
        link = _Link(handler.connection, handler.wfile)
        with self._changed:
            self._links.append(link)
            hello = {
                "type": "hello",
                "num_connections": len(self._links),
                "debug_info": {"host": "local"},
                "connection_info": {"app_id": self.app_id},
            }
            link.send(encode(TEXT, json.dumps(hello).encode()))
            self._changed.notify_all()
        threading.Thread(target=self._keep_alive, args=(link,), daemon=True).start()
        try:
            self._read(link, handler.rfile)
        finally:
            link.forget()
            with self._changed:
                self._links.remove(link)

    def _keep_alive(self, link: _Link) -> None:
        # slack_sdk's built-in client holds its receive lock while blocked in recv (3 s timeout),
        # and close() waits for that lock; frequent pings let an app disconnect at once.
        while not link.gone.wait(self.ping_interval_s):
            try:
                link.send(encode(PING, b"local"))
            except OSError:
                return

    def _read(self, link: _Link, stream: BufferedIOBase) -> None:
        while (message := read_message(stream)) is not None:
            opcode, payload = message
            if opcode == PING:
                link.send(encode(PONG, payload))
            elif opcode == CLOSE:
                link.send(encode(CLOSE, payload[:2]))
                return
            elif opcode == TEXT:
                self._ack(payload)

    def _ack(self, payload: bytes) -> None:
        try:
            ack = json.loads(payload)
        except ValueError:
            return
        if not isinstance(ack, dict):
            return
        with self._changed:
            pending = self._pending.pop(str(ack.get("envelope_id")), None)
        if pending is not None:
            pending.payload = ack.get("payload") or {}
            pending.arrived.set()

    def wait_connected(self, timeout: float = 5.0) -> None:
        """Wait until an app holds a connection; TimeoutError otherwise."""
        with self._changed:
            if not self._changed.wait_for(lambda: bool(self._links), timeout):
                raise TimeoutError(f"no Socket Mode connection within {timeout} s")

    @property
    def connected(self) -> int:
        with self._changed:
            return len(self._links)

    def send(
        self, envelope_type: str, payload: dict[str, Any], timeout: float = 5.0
    ) -> dict[str, Any]:
        """Deliver one envelope to the newest connection; the payload of the app's ack.

        Raises TimeoutError when no app is connected or no ack comes (Bolt sends none for a
        request no listener handled).
        """
        if envelope_type not in ENVELOPE_TYPES:
            raise ValueError(f"envelope type {envelope_type!r} is not one of {ENVELOPE_TYPES}")
        self.wait_connected(timeout)
        envelope_id = str(uuid.uuid4())
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id,
            "type": envelope_type,
            "accepts_response_payload": envelope_type == "slash_commands"
            or payload.get("type") in RESPONDING_INTERACTIONS,
            "payload": payload,
        }
        if envelope_type == "events_api":
            envelope |= {"retry_attempt": 0, "retry_reason": ""}
        pending = _Pending()
        with self._changed:
            self._pending[envelope_id] = pending
            link = self._links[-1]
        link.send(encode(TEXT, json.dumps(envelope).encode()))
        if not pending.arrived.wait(timeout):
            with self._changed:
                self._pending.pop(envelope_id, None)
            raise TimeoutError(f"no ack for {envelope_type} envelope {envelope_id} in {timeout} s")
        return pending.payload or {}

    def hang_up(self) -> None:
        """Close every connection (the server is stopping)."""
        with self._changed:
            links = list(self._links)
        for link in links:
            link.hang_up()
