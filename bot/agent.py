"""The node agent (`gpubot agent`): polls this node's GPUs (NVML, or a simulated fleet) and
pushes the samples to the bot's POST /agent/samples, signed with the node's token; carries out
the enforcement orders the bot answers with (bot.enforce) and posts the results to
/agent/results.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bot.enforce import carry_out
from bot.telemetry.errors import FleetError, TelemetryUnavailable
from bot.telemetry.fleet import load_fleet
from bot.telemetry.model import GpuSource, sign, to_json
from bot.telemetry.nvml import NvmlSource
from bot.telemetry.procs import ProcReader
from bot.telemetry.simulated import SimulatedSource
from bot.telemetry.sources import this_node

log = logging.getLogger(__name__)

PATH = "/agent/samples"
RESULTS_PATH = "/agent/results"
RETRYABLE = frozenset({0, 429, 500, 502, 503, 504})  # 0: no answer at all
TIMEOUT_S = 10.0


class AgentError(Exception):
    """The agent cannot do its job; the message is one line for the operator."""


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AgentError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if not token:
        raise AgentError(f"the token file {path} is empty")
    return token


def post(url: str, node: str, token: str, body: bytes, now: datetime) -> tuple[int, str]:
    """One signed POST; (0, why) when no HTTP answer came back."""
    stamp, nonce = str(int(now.timestamp())), secrets.token_hex(16)
    request = urllib.request.Request(  # noqa: S310 - run_agent admits only http(s) URLs
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "gpubot-agent",
            "X-Gpubot-Node": node,
            "X-Gpubot-Timestamp": stamp,
            "X-Gpubot-Nonce": nonce,
            "X-Gpubot-Signature": sign(token, stamp, nonce, body),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        with exc:  # an HTTPError holds the open response
            return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, f"cannot reach {url}: {reason}"


class Agent:
    """Polls `source` and pushes to `bot_url` as `node`; the token is re-read every poll, so a
    rotated token file takes effect without a restart.

    A push that fails for a passing reason (no answer, 5xx, 429) is retried with backoff, never
    past the next poll: fresher samples replace it. A refusal (401, 400, 403) is not retried.
    Orders in the bot's answer are carried out at once (`dry_run` only reports what it would
    signal, whatever the order says) and their results posted back.
    """

    def __init__(
        self,
        bot_url: str,
        token_file: Path,
        node: str,
        source: GpuSource,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], None] = time.sleep,
        attempts: int = 4,
        dry_run: bool = False,
        procs: ProcReader | None = None,
    ) -> None:
        if urlsplit(bot_url).scheme not in ("http", "https"):
            raise AgentError(f"--bot-url must be an http:// or https:// URL, not {bot_url!r}")
        self.url = bot_url.rstrip("/") + PATH
        self.results_url = bot_url.rstrip("/") + RESULTS_PATH
        self.dry_run, self.procs = dry_run, procs or ProcReader()
        self.token_file, self.node, self.source = token_file, node, source
        self.clock, self.sleep, self.attempts = clock, sleep, attempts
        self.token = read_token(token_file)

    def push_once(self, deadline_s: float) -> tuple[int, str]:
        """Poll, then push with backoff (1 s, 2 s, 4 s ...) until answered or `deadline_s`."""
        try:
            self.token = read_token(self.token_file)
        except AgentError as exc:
            log.warning("%s; keeping the token read before", exc)
        try:
            samples = self.source.poll(self.clock())
        except TelemetryUnavailable as exc:
            raise AgentError(str(exc)) from None
        return self._post(self.url, to_json(samples), deadline_s)

    def _post(self, url: str, body: bytes, deadline_s: float) -> tuple[int, str]:
        give_up = time.monotonic() + deadline_s
        status, message = 0, "not sent"
        for attempt in range(self.attempts):
            status, message = post(url, self.node, self.token, body, self.clock())
            if status not in RETRYABLE:
                break
            pause = float(2**attempt)
            if attempt + 1 == self.attempts or time.monotonic() + pause > give_up:
                break
            log.info("push failed (%s); retrying in %.0f s", message or status, pause)
            self.sleep(pause)
        return status, message

    def enforce(self, answer: str) -> list[tuple[int, str]]:
        """Carry out the orders in the bot's answer to a push; (status, message) per post."""
        try:
            data = json.loads(answer)
        except json.JSONDecodeError:
            return []  # an older bot answers in plain text, and gives no orders
        orders = data.get("orders", []) if isinstance(data, dict) else []
        answers = []
        for order in orders:
            if not isinstance(order, dict) or not isinstance(order.get("id"), int):
                log.warning("ignoring a malformed order: %r", order)
                continue
            results = carry_out(order, self.procs, dry_run=self.dry_run)
            log.info("order %s: %s", order["id"], results)
            body: dict[str, Any] = {"order": order["id"], "results": results}
            answers.append(self._post(self.results_url, json.dumps(body).encode(), 30.0))
        return answers

    def run(self, interval: timedelta, *, once: bool = False, cycles: int | None = None) -> None:
        """Push every `interval` until interrupted (or once, or `cycles` times)."""
        every = interval.total_seconds()
        count = 0
        while True:
            began = time.monotonic()
            status, message = self.push_once(every / 2 if not once else 30.0)
            count += 1
            if status == 200:
                log.debug("pushed: %s", message)
                for posted, why in self.enforce(message):
                    if posted != 200:
                        log.warning("results not recorded (%s): %s", posted or "no answer", why)
            elif once:
                raise AgentError(
                    f"the bot refused the samples ({status or 'no answer'}): {message}"
                )
            else:
                log.warning("push failed (%s): %s", status or "no answer", message)
            if once or (cycles is not None and count >= cycles):
                return
            self.sleep(max(0.0, every - (time.monotonic() - began)))


def run_agent(
    bot_url: str,
    token_file: Path,
    *,
    node: str | None = None,
    interval: timedelta = timedelta(seconds=30),
    once: bool = False,
    simulated: Path | None = None,
    sleep: Callable[[float], None] = time.sleep,
    cycles: int | None = None,
    dry_run: bool = False,
) -> None:
    """`gpubot agent`: build the source, then push until stopped; AgentError says what is wrong."""
    source: NvmlSource | SimulatedSource
    if simulated is not None:
        try:
            fleet = load_fleet(simulated)
        except FleetError as exc:
            raise AgentError(str(exc).splitlines()[0]) from None
        if node is None and len(fleet.nodes) != 1:
            raise AgentError(f"{simulated} has several nodes: name one with --node")
        node = node or next(iter(fleet.nodes))
        try:
            source = SimulatedSource(fleet, datetime.now(UTC), node=node)
        except ValueError as exc:
            raise AgentError(str(exc)) from None
    else:
        node = node or this_node()
        source = NvmlSource(node)
    agent = Agent(bot_url, token_file, node, source, sleep=sleep, dry_run=dry_run)
    log.info("gpubot agent: node %s -> %s every %g s", node, agent.url, interval.total_seconds())
    try:
        agent.run(interval, once=once, cycles=cycles)
    finally:
        source.close()
