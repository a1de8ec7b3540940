"""The bot's end of the node agent: verify a signed push of samples, refuse replays, hand the
samples to `Telemetry` and answer with the node's enforcement orders; take the agent's results.
Framework-free: `handle(headers, body)` and `handle_results(headers, body)` -> (status, message).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from bot.telemetry.errors import SampleFormatError, TokenFileError
from bot.telemetry.model import from_json, sign
from bot.telemetry.window import Telemetry

log = logging.getLogger(__name__)

Refused = Callable[[str, str], None]
Orders = Callable[[str], list[dict[str, Any]]]  # node -> its pending orders, now marked sent
# (node, order id, [{pid, outcome}]) -> None when recorded, else why not
Results = Callable[[str, int, list[dict[str, Any]]], "str | None"]
MIN_TOKEN_LENGTH = 16


def load_tokens(path: Path) -> dict[str, str]:
    """The agent tokens file (GPUBOT_AGENT_TOKENS_FILE): YAML `node: token`, one per node."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TokenFileError(
            f"{path}: cannot read the agent tokens: {exc.strerror or exc}"
        ) from None
    except yaml.YAMLError as exc:
        raise TokenFileError(f"{path}: not YAML: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise TokenFileError(f"{path}: expected a mapping of node names to tokens")
    tokens: dict[str, str] = {}
    for node, token in data.items():
        if not isinstance(node, str) or not isinstance(token, str):
            raise TokenFileError(f"{path}: {node!r}: node names and tokens must be strings")
        if len(token) < MIN_TOKEN_LENGTH:
            raise TokenFileError(
                f"{path}: the token of {node} is shorter than {MIN_TOKEN_LENGTH} characters; "
                "make one with `openssl rand -hex 32`"
            )
        tokens[node] = token
    return tokens


@dataclass(frozen=True, slots=True)
class _Signed:
    node: str
    stamp: int  # the request's X-Gpubot-Timestamp, epoch seconds
    now: datetime  # the bot's clock when it arrived


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Ingest:
    """Verifies agent pushes against per-node tokens (`node -> token`).

    401: unknown node, bad or missing signature, a timestamp more than `max_skew` off, or a
    nonce already used (remembered only while its timestamp would be accepted); 400: a body
    that is not a samples document; 403: samples naming another node; 429: more than
    `max_nonces` pushes from one node within the window. Each refusal is reported to
    `on_refused(node, reason)` for the log and the audit trail; 200 hands the samples, moved
    onto the bot's clock, to `telemetry.observe`, and answers JSON
    `{"ok": true, "taken": n, "orders": [...]}` with the node's pending `orders(node)`.
    `handle_results` takes `{"order": id, "results": [{"pid", "outcome"}]}`, signed the same
    way, and hands it to `results`; 409 when that refuses it.
    """

    def __init__(
        self,
        tokens: Mapping[str, str],
        telemetry: Telemetry,
        clock: Callable[[], datetime] = _utcnow,
        on_refused: Refused | None = None,
        *,
        orders: Orders | None = None,
        results: Results | None = None,
        max_skew: timedelta = timedelta(minutes=5),
        max_nonces: int = 1000,
    ) -> None:
        self.tokens = dict(tokens)
        self.telemetry = telemetry
        self.clock = clock
        self.on_refused = on_refused
        self.orders, self.results = orders, results
        self.max_skew = max_skew
        self.max_nonces = max_nonces
        # node -> nonce -> epoch second after which its timestamp is refused anyway
        self._nonces: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def handle(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        """A push of samples (POST /agent/samples)."""
        signed = self._verify(headers, body)
        if not isinstance(signed, _Signed):
            return signed
        node, stamp, now = signed.node, signed.stamp, signed.now
        try:
            samples = from_json(body)
        except SampleFormatError as exc:
            return self._refuse(400, node, f"malformed samples: {exc}")
        strangers = sorted({s.node for s in samples} - {node})
        if strangers:
            return self._refuse(403, node, f"samples for another node: {', '.join(strangers)}")
        # Move the samples onto the bot's clock: a node whose clock lags by a minute would
        # otherwise look a minute stale. The offset includes the (small) transit time.
        offset = now - datetime.fromtimestamp(stamp, UTC)
        taken = self.telemetry.observe([s.shifted(offset) for s in samples])
        orders: list[dict[str, Any]] = []
        if self.orders is not None:
            try:
                orders = self.orders(node)
            except Exception:
                # The samples are taken; the orders stay pending for the next push.
                log.exception("reading the enforcement orders of %r failed", node)
        return 200, json.dumps({"ok": True, "taken": taken, "orders": orders})

    def handle_results(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        """What the agent did with an order (POST /agent/results)."""
        signed = self._verify(headers, body)
        if not isinstance(signed, _Signed):
            return signed
        node = signed.node
        try:
            order, results = _results_from_json(body)
        except ValueError as exc:
            return self._refuse(400, node, f"malformed results: {exc}")
        if self.results is None:
            return self._refuse(409, node, "this bot gives no enforcement orders")
        refusal = self.results(node, order, results)
        if refusal is not None:
            return self._refuse(409, node, refusal)
        return 200, json.dumps({"ok": True})

    def _verify(self, headers: Mapping[str, str], body: bytes) -> _Signed | tuple[int, str]:
        """Who sent a correctly signed, fresh, unreplayed request; else the refusal."""
        fields = {name.lower(): value for name, value in headers.items()}
        node = fields.get("x-gpubot-node", "")
        token = self.tokens.get(node) if node else None
        if token is None:
            return self._refuse(401, node, "unknown node")
        stamp = fields.get("x-gpubot-timestamp", "")
        nonce = fields.get("x-gpubot-nonce", "")
        if not stamp.isdigit():
            return self._refuse(401, node, "missing or malformed X-Gpubot-Timestamp")
        now = self._now()
        skew = now.timestamp() - int(stamp)
        if abs(skew) > self.max_skew.total_seconds():
            limit = int(self.max_skew.total_seconds())
            reason = f"timestamp {skew:+.0f} s off the bot's clock (limit {limit} s): check NTP"
            return self._refuse(401, node, reason)
        if not nonce or len(nonce) > 128:
            return self._refuse(401, node, "missing or malformed X-Gpubot-Nonce")
        expected = sign(token, stamp, nonce, body)
        if not hmac.compare_digest(expected, fields.get("x-gpubot-signature", "")):
            return self._refuse(401, node, "bad signature")
        # Only a correctly signed request may spend a nonce, so strangers cannot fill the store.
        verdict = self._spend(node, nonce, int(stamp) + self.max_skew.total_seconds(), now)
        if verdict is not None:
            return verdict
        return _Signed(node, int(stamp), now)

    def _spend(
        self, node: str, nonce: str, expires: float, now: datetime
    ) -> tuple[int, str] | None:
        with self._lock:
            seen = self._nonces.setdefault(node, {})
            for old in [n for n, until in seen.items() if until < now.timestamp()]:
                del seen[old]
            replayed, full = nonce in seen, len(seen) >= self.max_nonces
            if not replayed and not full:
                seen[nonce] = expires
        if replayed:
            return self._refuse(401, node, "replayed request (nonce already used)")
        if full:
            return self._refuse(429, node, "too many pushes; slow the agent down")
        return None

    def _now(self) -> datetime:
        now = self.clock()
        return now if now.tzinfo is not None else now.replace(tzinfo=UTC)  # freezegun is naive

    def _refuse(self, status: int, node: str, reason: str) -> tuple[int, str]:
        log.warning("agent push from %r refused (%d): %s", node, status, reason)
        if self.on_refused is not None:
            try:
                self.on_refused(node, reason)
            except Exception:
                # Reporting a refusal must not turn it into a 500 for the agent.
                log.exception("on_refused failed for %r", node)
        return status, reason


def _results_from_json(body: bytes) -> tuple[int, list[dict[str, Any]]]:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("expected an object")
    order, results = data.get("order"), data.get("results")
    if not isinstance(order, int) or isinstance(order, bool):
        raise ValueError("order: expected an integer id")
    if not isinstance(results, list):
        raise ValueError("results: expected a list")
    out = []
    for k, item in enumerate(results):
        pid = item.get("pid") if isinstance(item, dict) else None
        outcome = item.get("outcome") if isinstance(item, dict) else None
        if not isinstance(pid, int) or not isinstance(outcome, str):
            raise ValueError(f"results[{k}]: expected {{pid: int, outcome: str}}")
        out.append({"pid": pid, "outcome": outcome[:200]})
    return order, out
