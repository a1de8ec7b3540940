"""The node agent (`gpubot agent`): polls this node's GPUs (NVML, or a simulated fleet) and
pushes the samples to the bot's POST /agent/samples, signed with the node's token; carries out
the enforcement orders the bot answers with (bot.agent.enforcer), once each and only when signed by
the bot for this node and not expired, and posts the results to /agent/results.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from bot.agent.enforcer import MIN_UID, carry_out, order_pids, refused
from bot.telemetry.errors import FleetError, SampleFormatError, TelemetryUnavailable
from bot.telemetry.fleet_file import load_fleet
from bot.telemetry.model import MAX_ID, GpuSource, load_document, order_signature, sign, to_json
from bot.telemetry.nvml import NvmlSource
from bot.telemetry.procs import ProcReader
from bot.telemetry.simulated import SimulatedSource
from bot.telemetry.sources import this_node

log = logging.getLogger(__name__)

PATH = "/agent/samples"
RESULTS_PATH = "/agent/results"
RETRYABLE = frozenset({0, 429, 500, 502, 503, 504})  # 0: no answer at all
TIMEOUT_S = 10.0
MAX_ORDERS = 100  # in one answer; the rest wait for the next push
MAX_ORDER_TTL = timedelta(days=1)  # an expiry further ahead is not the bot's
AGAIN = "carried out before"


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


def _is_id(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID


class Agent:
    """Polls `source` and pushes to `bot_url` as `node`; the token is re-read every poll, so a
    rotated token file takes effect without a restart.

    A push that fails for a passing reason (no answer, 5xx, 429) is retried with backoff, never
    past the next poll: fresher samples replace it. A refusal (401, 400, 403) is not retried.
    Orders in the bot's answer are carried out at once (`dry_run` only reports what it would
    signal, whatever the order says) and their results posted back. An order must be signed
    with this node's token, name this node and not have expired; one carried out before is
    not carried out again. Nothing one order holds can stop the agent: a refused or failed
    order is logged with its id and reported as `refused: ...` under the pids it names.
    Processes of system accounts and of uids below `min_uid` are never signalled.
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
        min_uid: int = MIN_UID,
    ) -> None:
        if urlsplit(bot_url).scheme not in ("http", "https"):
            raise AgentError(f"--bot-url must be an http:// or https:// URL, not {bot_url!r}")
        if min_uid < 0:
            raise AgentError(f"--min-uid must be 0 or more, not {min_uid}")
        self.url = bot_url.rstrip("/") + PATH
        self.results_url = bot_url.rstrip("/") + RESULTS_PATH
        self.dry_run, self.procs, self.min_uid = dry_run, procs or ProcReader(), min_uid
        self.token_file, self.node, self.source = token_file, node, source
        self.clock, self.sleep, self.attempts = clock, sleep, attempts
        self.token = read_token(token_file)
        self._done: dict[int, float] = {}  # order id -> its expiry (epoch s): carried out

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
            data = load_document(answer)
        except SampleFormatError:
            return []  # an older bot answers in plain text, and gives no orders
        orders = data.get("orders", []) if isinstance(data, dict) else []
        if not isinstance(orders, list):
            log.warning("ignoring the orders of an answer that are not a list")
            return []
        if len(orders) > MAX_ORDERS:
            log.warning(
                "%d orders in one answer; carrying out the first %d", len(orders), MAX_ORDERS
            )
        answers = []
        for order in orders[:MAX_ORDERS]:
            done = self._one(order)
            if done is not None:
                body = json.dumps({"order": done[0], "results": done[1]}).encode()
                answers.append(self._post(self.results_url, body, 30.0))
        return answers

    def _one(self, order: Any) -> tuple[int, list[dict[str, Any]]] | None:
        """Check and carry out one order: (its id, the results to report), or None when there
        is nothing to report under (no id, or carried out before)."""
        order_id = order.get("id") if isinstance(order, dict) else None
        if not isinstance(order, dict) or not _is_id(order_id):
            log.warning("ignoring an order without an id: %.200r", order)
            return None
        try:
            why = self._refusal(order)
            if why == AGAIN:
                log.warning("order %d: carried out before; not again", order_id)
                return None
            if why is not None:
                log.warning("order %d refused: %s", order_id, why)
                results = refused(order, why)
            else:
                results = carry_out(order, self.procs, dry_run=self.dry_run, min_uid=self.min_uid)
                log.info("order %d: %s", order_id, results)
        except Exception:
            # One order must never stop the agent; what it did so far is unknown, so say so.
            log.exception("order %d failed", order_id)
            why = "failed: the agent hit an error carrying it out; see its log"
            results = [{"pid": pid, "outcome": why} for pid in order_pids(order)]
        if why is not None and not results:
            return None  # under no pid at all, the bot would read it as "nothing to signal"
        return order_id, results

    def _refusal(self, order: dict[str, Any]) -> str | None:
        """Why this order must not be carried out, or None. Spends its id when it may be."""
        signature = order.get("signature")
        if not isinstance(signature, str):
            return "unsigned order"
        try:
            expected = order_signature(self.token, order)
        except (TypeError, ValueError):  # NaN, or keys JSON cannot sort
            return "malformed order"
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
            return "bad order signature"
        if order.get("node") != self.node:
            return f"order for another node ({str(order.get('node'))[:64]!r})"
        expires = order.get("expires")
        now = self.clock().timestamp()
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            return "malformed order: no expiry"
        if not now < expires <= now + MAX_ORDER_TTL.total_seconds():
            return "order expired" if expires <= now else "malformed order: expiry too far ahead"
        self._done = {k: until for k, until in self._done.items() if until >= now}
        if order["id"] in self._done:
            return AGAIN
        self._done[order["id"]] = float(expires)
        return None

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
                try:
                    posts = self.enforce(message)
                except Exception:
                    # No answer from the bot may stop the agent: the next push comes anyway.
                    log.exception("carrying out the orders failed")
                    posts = []
                for posted, why in posts:
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
    min_uid: int = MIN_UID,
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
    agent = Agent(bot_url, token_file, node, source, sleep=sleep, dry_run=dry_run, min_uid=min_uid)
    log.info("gpubot agent: node %s -> %s every %g s", node, agent.url, interval.total_seconds())
    try:
        agent.run(interval, once=once, cycles=cycles)
    finally:
        source.close()
