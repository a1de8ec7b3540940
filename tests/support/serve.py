"""`gpubot serve --http` as its own process, started from the documented environment, for the
tests that treat the bot as an operator would: start it, send it signed requests, kill it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from bot.localslack import BOT_TOKEN, LocalSlack
from bot.server import free_port
from bot.settings import DEFAULT_RULES_DIR

GPUBOT = Path(sys.executable).parent / "gpubot"
SECRET = "local-signing-secret"  # noqa: S105  (the local workspace's, never real)


class Served:
    """One bot process at a time on a fixed port; `start` again after `kill` is a restart."""

    def __init__(
        self,
        local: LocalSlack,
        workdir: Path,
        *,
        database_url: str | None = None,
        env: Mapping[str, str | None] | None = None,
        gpubot: Path = GPUBOT,
    ) -> None:
        """`env` adds to the documented environment; a None value leaves that variable unset.
        `gpubot` is the console script to run (default: this environment's)."""
        self.workdir = workdir
        self.gpubot = gpubot
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events_url = self.url + "/slack/events"
        self.log_path = workdir / "serve.log"
        self.database_url = database_url or f"sqlite:///{workdir / 'serve.db'}"
        documented: dict[str, str | None] = {
            **{k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
            "SLACK_BOT_TOKEN": BOT_TOKEN,
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_API_URL": local.api_url,
            "GPUBOT_DATABASE_URL": self.database_url,
            "GPUBOT_RULES_DIR": str(DEFAULT_RULES_DIR),
            "GPUBOT_TELEMETRY": "simulated",
            **(env or {}),
        }
        self.env = {k: v for k, v in documented.items() if v is not None}
        if "SLACK_APP_TOKEN" not in (env or {}):
            self.env.pop("SLACK_APP_TOKEN", None)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 60.0) -> None:
        """`gpubot serve --http` on the port; returns once it answers /livez."""
        self.launch(["serve", "--http", "--port", str(self.port)])
        self.wait("/livez", timeout)

    def launch(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """`gpubot ARGV...` in the background, logging to `log_path`."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our own console script
                [str(self.gpubot), *argv],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        self.starts += 1
        return self.process

    def wait(self, path: str, timeout: float = 30.0) -> dict[str, object]:
        """Poll `path` until it answers 200; its JSON."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise AssertionError(f"gpubot serve exited; its log ends:\n{self.log_tail()}")
            found = self.probe(path)
            if found is not None and found[0] == 200:
                return found[1]
            time.sleep(0.05)
        raise AssertionError(f"{path} did not answer 200 in time; the log ends:\n{self.log_tail()}")

    def probe(self, path: str) -> tuple[int, dict[str, object]] | None:
        """(status, JSON) of one GET, None when nothing answered."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as answer:  # noqa: S310
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            with error:
                return error.code, json.loads(error.read() or b"{}")
        except OSError:
            return None

    def kill(self) -> None:
        """kill -9: no shutdown, no flush, whatever was in flight is cut."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=15)

    def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL after 15 s); the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        return self.process.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(empty log)"
