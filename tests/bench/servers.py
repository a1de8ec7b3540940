"""The benchmarks' servers as their own OS processes: started with the documented environment,
waited for on /healthz, asked for their backlog, and stopped (SIGTERM, then SIGKILL) however
the run ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.localslack import BOT_TOKEN, LocalSlack
from bot.settings import DEFAULT_RULES_DIR

START_S = 60.0  # longest wait for a server to answer /healthz
STOP_S = 15.0  # longest wait for a server to exit after SIGTERM, before SIGKILL
# `gpubot serve` logs "time LEVEL logger: message"; uvicorn's own lines read "LEVEL:  message".
LOG_LINE = re.compile(
    r"^\S+ \S+ (?P<level>WARNING|ERROR|CRITICAL) (?P<name>\S+): (?P<msg>.*)$"
    r"|^(?P<ulevel>WARNING|ERROR|CRITICAL):\s+(?P<umsg>.*)$"
)


@dataclass
class Child:
    """A server running as its own process, listening on 127.0.0.1:port, logging into `log`."""

    name: str
    argv: list[str]
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode} during the run; "
                f"its log ends:\n{self.log_tail()}"
            )

    def health(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """/healthz as JSON ({} when it does not answer)."""
        url = f"http://127.0.0.1:{self.port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as answer:
                found = json.loads(answer.read())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}


def server_env(
    local: LocalSlack, database: Path, secret: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """This environment without proxies or any Slack/gpubot setting of its own, plus the
    documented variables: the bot token, the signing secret, the LocalSlack API, the database
    and the shipped rules, and `extra`."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.lower().endswith("_proxy") and not name.startswith(("SLACK_", "GPUBOT_"))
    }
    return {
        **inherited,
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": secret,
        "SLACK_API_URL": local.api_url,
        "GPUBOT_DATABASE_URL": f"sqlite:///{database}",
        "GPUBOT_RULES_DIR": str(DEFAULT_RULES_DIR),
        **(extra or {}),
    }


def wait_healthy(child: Child) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with {child.process.returncode} on start-up; "
                f"its log ends:\n{child.log_tail()}"
            )
        if child.health(timeout_s=2).get("ok"):
            return
        time.sleep(0.1)
    raise RuntimeError(
        f"{child.name} did not answer /healthz in {START_S:g} s:\n{child.log_tail()}"
    )


def stop(child: Child) -> None:
    """SIGTERM (uvicorn shuts down cleanly on it), then SIGKILL if it is still there."""
    if child.alive():
        child.process.send_signal(signal.SIGTERM)
    try:
        child.process.wait(STOP_S)
    except subprocess.TimeoutExpired:
        child.process.kill()
        child.process.wait()


@contextlib.contextmanager
def spawned(
    name: str, argv: list[str], env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[Child]:
    """`argv` as its own process, output into `log`; yields once it answers /healthz, and is
    stopped when the block ends, however it ends."""
    with log.open("wb") as sink:
        process = subprocess.Popen(  # noqa: S603 - our own console script and module
            argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink
        )
        child = Child(name, argv, int(argv[argv.index("--port") + 1]), process, log)
        try:
            wait_healthy(child)
            yield child
        finally:
            stop(child)


def logged_warnings(log: Path) -> list[str]:
    """WARNING and above in a server's log, counted by level and logger, with an example."""
    kinds: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for line in log.read_text(errors="replace").splitlines():
        found = LOG_LINE.match(line)
        if found is None:
            continue
        if found["level"]:
            kind, message = (found["level"], found["name"]), found["msg"]
        else:
            kind, message = (found["ulevel"], "uvicorn"), found["umsg"]
        kinds[kind] += 1
        example.setdefault(kind, message)
    return [
        f"{n} x {level} {name}: {example[(level, name)][:100]}"
        for (level, name), n in kinds.most_common()
    ]
