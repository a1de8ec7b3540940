"""The page's web server, on 127.0.0.1 only: the static page (plain HTML, CSS and JavaScript from
this package, nothing from the internet), GET /ui/state and the POST /ui/* actions."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from bot.workspace.demo import Demo
from bot.workspace.state import page_state
from bot.workspace.ui import ROUTES, UiError

log = logging.getLogger(__name__)
HOST = "127.0.0.1"
STATIC = Path(__file__).resolve().parent / "static"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
MAX_BODY = 64 * 1024


class PageServer:
    """Binds 127.0.0.1:`port` at once (port 0 picks a free one), so a taken port is known before
    anything else starts; `start(demo)` serves the page for `demo`."""

    def __init__(self, port: int = 8080) -> None:
        self.demo: Demo | None = None
        self._server = _Server((HOST, port), _handler(self))
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="demo-page", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def start(self, demo: Demo) -> PageServer:
        self.demo = demo
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(10)
        self._server.server_close()

    def allowed_host(self, host: str) -> bool:
        """Only this page's own address: a rebound DNS name pointing here is turned away."""
        return host in (f"{HOST}:{self.port}", f"localhost:{self.port}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    """The page's routes, for the PageServer a subclass names in `page` (see _handler)."""

    page: ClassVar[PageServer]

    protocol_version = "HTTP/1.1"
    server_version = "gpubot-demo"

    @property
    def demo(self) -> Demo:
        assert self.page.demo is not None  # requests are served only after start(demo)
        return self.page.demo

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if not self.page.allowed_host(self.headers.get("Host", "")):
            self._send(403, "text/plain; charset=utf-8", b"forbidden")
            return
        if url.path == "/ui/state":
            query = parse_qs(url.query)
            person, reading = query.get("as", [""])[0], query.get("in", [""])[0]
            self._json(200, page_state(self.demo, person, reading))
            return
        if url.path.startswith("/files/"):
            self._file(url.path)
            return
        name = "index.html" if url.path == "/" else url.path.removeprefix("/static/")
        files = {p.name: p for p in STATIC.iterdir() if p.suffix in TYPES}
        if name not in files:
            self._send(404, "text/plain; charset=utf-8", b"not found")
            return
        self._send(200, TYPES[files[name].suffix], files[name].read_bytes())

    def _file(self, path: str) -> None:
        """A file shared in the workspace (a report's chart or CSV), for the page to show."""
        file_id, _, _ = path.removeprefix("/files/").partition("/")
        file = self.demo.local.workspace.file(file_id)
        if file is None or file.content is None or not file.completed:
            self._send(404, "text/plain; charset=utf-8", b"not found")
            return
        self._send(200, file.mimetype, file.content)

    def do_POST(self) -> None:
        route = ROUTES.get(urlsplit(self.path).path)
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(size, MAX_BODY + 1))
        # A JSON content type makes a cross-site form post impossible without CORS.
        json_type = self.headers.get("Content-Type", "").startswith("application/json")
        if not self.page.allowed_host(self.headers.get("Host", "")) or not json_type:
            self._json(403, {"ok": False, "error": "forbidden"})
            return
        if route is None or size > MAX_BODY:
            self._json(404, {"ok": False, "error": "not found"})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise UiError("expected a JSON object")
            self._json(200, route(self.demo, body))
        except (UiError, ValueError) as exc:
            self._json(400, {"ok": False, "error": str(exc)})
        except Exception as exc:  # shown on the page and logged, never a dead request
            log.exception("demo page: %s failed", self.path)
            self._json(500, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})

    def _json(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, "application/json", json.dumps(body).encode())

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
        except ConnectionError:
            self.close_connection = True


def _handler(page: PageServer) -> type[BaseHTTPRequestHandler]:
    """A request handler class serving `page`."""

    class Handler(_Handler):
        pass

    Handler.page = page
    return Handler
