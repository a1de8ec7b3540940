"""A loopback HTTP server answering with recorded text: a DCGM exporter's /metrics, Prometheus's
/api/v1/query (answered by the `query` asked), or a slow or refusing node."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bot.server import free_port

ROOT = Path(__file__).resolve().parents[3]
DCGM = ROOT / "fixtures" / "dcgm"
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Answer:
    body: str
    status: int = 200
    content_type: str = EXPOSITION
    hold_s: float = 0.0  # wait this long before answering (a slow node)


class Recorded(ThreadingHTTPServer):
    """Answers GET by path, and /api/v1/query by its `query`; `asked` lists what was asked."""

    daemon_threads = True
    request_queue_size = 128  # a poll connects to every node at once

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: dict[str, Answer] = {}
        self.asked: list[str] = []
        self.released = threading.Event()  # ends every hold at once when the test is over

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def record(self, key: str, fixture: str, **answer: Any) -> None:
        """Answer `key` (a path, or `query:` and a PromQL query) with a file of fixtures/dcgm."""
        self.answers[key] = Answer((DCGM / fixture).read_text(), **answer)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up on a slow answer is what the slow node is for: no traceback."""


class _Handler(BaseHTTPRequestHandler):
    server: Recorded

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        key = parts.path
        if parts.path == "/api/v1/query":
            key = "query:" + parse_qs(parts.query).get("query", [""])[0]
        self.server.asked.append(key)
        answer = self.server.answers.get(key, Answer("not recorded\n", 404, "text/plain"))
        if answer.hold_s:
            self.server.released.wait(answer.hold_s)
        body = answer.body.encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read what was asked from `asked`."""


@contextmanager
def recorded() -> Iterator[Recorded]:
    server = Recorded()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join()


def nothing_listening() -> str:
    """The URL of a loopback port nobody listens on: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}/metrics"
