"""The bot's end of the node agent: verify a signed push of samples, refuse replays, hand the
samples to `TelemetryWindow` and answer with the node's enforcement orders, signed; take the agent's
results. Framework-free: `handle(headers, body)` and `handle_results(headers, body)` ->
(status, message); neither raises, whatever the bytes and the headers.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from bot.telemetry.errors import SampleFormatError, TokenFileError
from bot.telemetry.model import from_json, results_from_json, sign, sign_order
from bot.telemetry.refusals import UNKNOWN, Refusals
from bot.telemetry.window import TelemetryWindow

log = logging.getLogger(__name__)

Refused = Callable[[str, str], None]
Orders = Callable[[str], list[dict[str, Any]]]  # node -> its pending orders, now marked sent
# (node, order id, [{pid, outcome}]) -> None when recorded, else why not
Results = Callable[[str, int, list[dict[str, Any]]], "str | None"]
# (node, nonce, expires_at) -> True when spent now, False when it was spent before (a replay)
Spend = Callable[[str, str, datetime], bool]
Handler = Callable[[Mapping[str, str], bytes], tuple[int, str]]
Pending = Callable[[], Collection[str]]  # the nodes with orders waiting for their agent
MIN_TOKEN_LENGTH = 16
MAX_BODY = 1 << 20

_STAMP = re.compile(r"[0-9]{1,12}")  # ASCII digits: str.isdigit() takes "²" too
_NONCE = re.compile(r"[!-~]{1,128}")  # visible ASCII, as long as the nonce table's column
_SIGNATURE = re.compile(r"v1=[0-9a-f]{64}")
_AGREED = timedelta(seconds=2)  # a node's clock this close to the bot's is not corrected
_NO_OFFSET = timedelta(0)


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
    token: str
    stamp: int  # the request's X-Gpubot-Timestamp, epoch seconds
    now: datetime  # the bot's clock when it arrived


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Ingest:
    """Verifies agent pushes against per-node tokens (`node -> token`).

    401: unknown node, bad or missing signature, a timestamp more than `max_skew` off, or a
    nonce already used; 413: a body over `max_body` bytes; 400: a body that is not a samples
    document, or a sample taken more than `max_skew` from the request's timestamp; 403:
    samples naming another node; 429: more than `max_nonces` pushes from one node within the
    window; 503: the nonce could not be recorded. 200 hands the samples, moved onto the bot's
    clock, to `telemetry.observe`, and answers JSON `{"ok": true, "taken": n, "orders": [...]}`
    with the node's pending `orders(node)`, each signed with the node's token and carrying the
    node's name and an expiry `order_ttl` ahead (model.sign_order). `handle_results` takes
    `{"order": id, "results": [{"pid", "outcome"}]}`, signed the same way, and hands it to
    `results`; 409 when that refuses it.

    With `pending`, `orders(node)` (a write transaction) is asked only for the nodes that
    `pending()` named at its last read, at most `pending_every` ago: at one push per node per
    30 s from 12,500 nodes, almost every push finds nothing waiting. An order written since
    that read goes out with the node's first push after the next read.

    Nonces are spent in memory, and through `spend` when given (the database, so a restart
    forgets none); in memory only, they are remembered while their timestamp is accepted.

    Every refusal is counted by reason in `refusals` (unknown-node, too-large, bad-timestamp,
    clock-skew, bad-nonce, bad-signature, replayed, rate-limited, malformed, other-node,
    sample-time, no-orders, results-refused, unavailable) and logged, at most once per
    `log_every` per node (all unknown nodes together count as one); `on_refused(node, reason)`
    hears only of known nodes, as a node name alone proves nothing and would let anyone fill
    the audit log.
    """

    def __init__(
        self,
        tokens: Mapping[str, str],
        telemetry: TelemetryWindow,
        clock: Callable[[], datetime] = _utcnow,
        on_refused: Refused | None = None,
        *,
        orders: Orders | None = None,
        results: Results | None = None,
        max_skew: timedelta = timedelta(minutes=5),
        max_nonces: int = 1000,
        spend: Spend | None = None,
        order_ttl: timedelta = timedelta(minutes=10),
        max_body: int = MAX_BODY,
        log_every: timedelta = timedelta(seconds=60),
        pending: Pending | None = None,
        pending_every: timedelta = timedelta(seconds=2),
    ) -> None:
        self.tokens = dict(tokens)
        self.telemetry = telemetry
        self.clock = clock
        self.on_refused = on_refused
        self.orders, self.results = orders, results
        self.max_skew = max_skew
        self.max_nonces = max_nonces
        self.spend = spend
        # Longer than max_skew: an agent whose clock lags must not find its orders expired.
        self.order_ttl = order_ttl
        self.max_body = max_body
        self.refusals = Refusals(self._now, log_every)
        # node -> nonce -> epoch second after which its timestamp is refused anyway
        self._nonces: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self.pending, self.pending_every = pending, pending_every
        self._waiting: frozenset[str] | None = None  # pending()'s last answer
        self._waiting_read: datetime | None = None  # when it was asked

    def handle(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        """A push of samples (POST /agent/samples)."""
        return self._guarded(self._samples, headers, body)

    def handle_results(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        """What the agent did with an order (POST /agent/results)."""
        return self._guarded(self._results, headers, body)

    def _guarded(
        self, handler: Handler, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, str]:
        try:
            return handler(headers, body)
        except Exception:
            # Every input has its answer above; this is a bug or a broken database, so the
            # traceback is for whoever fixes it, and the agent retries.
            log.exception("an agent request failed")
            return 500, "internal error"

    def _samples(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        signed = self._verify(headers, body)
        if not isinstance(signed, _Signed):
            return signed
        node = signed.node
        try:
            samples = from_json(body)
        except SampleFormatError as exc:
            return self._refuse(400, node, "malformed", f"malformed samples: {exc}")
        strangers = sorted({s.node for s in samples} - {node})
        if strangers:
            names = ", ".join(strangers[:3]) + (" ..." if len(strangers) > 3 else "")
            return self._refuse(403, node, "other-node", f"samples for another node: {names}")
        sent = datetime.fromtimestamp(signed.stamp, UTC)
        for k, sample in enumerate(samples):
            # Checked before anything moves them: a sample from the year 9999 is refused here,
            # so it can never stand as a GPU's newest sample.
            off = sample.taken_at - sent
            if abs(off) > self.max_skew:
                limit = int(self.max_skew.total_seconds())
                reason = (
                    f"samples[{k}].taken_at is {off.total_seconds():+.0f} s from the "
                    f"request's timestamp (limit {limit} s)"
                )
                return self._refuse(400, node, "sample-time", reason)
        # Move the samples onto the bot's clock: a node whose clock lags by a minute would
        # otherwise look a minute stale. The offset includes the (small) transit time. The
        # timestamp is in whole seconds, so the offset is known only to a second or two: within
        # that, the clocks agree, and the samples keep their own times (shifted by it, a push
        # sent just after a second began could land before one sent just before, and be
        # dropped as not newer).
        offset = signed.now - sent
        if abs(offset) <= _AGREED:
            offset = _NO_OFFSET
        taken = self.telemetry.observe([s.shifted(offset) for s in samples], signed.now)
        return 200, json.dumps({"ok": True, "taken": taken, "orders": self._orders(signed)})

    def _orders(self, signed: _Signed) -> list[dict[str, Any]]:
        if self.orders is None or not self._may_have_orders(signed.node, signed.now):
            return []
        try:
            pending = self.orders(signed.node)
        except Exception:
            # The samples are taken; the orders stay pending for the next push.
            log.exception("reading the enforcement orders of %r failed", signed.node)
            return []
        expires = int((signed.now + self.order_ttl).timestamp())
        out = []
        for order in pending:
            try:
                out.append(
                    sign_order(signed.token, {**order, "node": signed.node, "expires": expires})
                )
            except ValueError:  # NaN in an order: the agent would refuse it anyway
                log.exception("order %s cannot be signed", order.get("id"))
        return out

    def _may_have_orders(self, node: str, now: datetime) -> bool:
        """Whether `orders(node)` may find something: always without `pending`."""
        if self.pending is None:
            return True
        with self._lock:
            read = self._waiting_read
            due = read is None or not timedelta(0) <= now - read < self.pending_every
            if due:
                self._waiting_read = now  # one thread reads; the others keep the last answer
            waiting = self._waiting
        if due or waiting is None:
            try:
                waiting = frozenset(self.pending())
            except Exception:
                log.exception("reading which nodes have orders waiting failed")
                with self._lock:
                    self._waiting_read = None  # ask again on the next push
                return True  # orders(node) answers for itself
            with self._lock:
                self._waiting = waiting
        return node in waiting

    def _results(self, headers: Mapping[str, str], body: bytes) -> tuple[int, str]:
        signed = self._verify(headers, body)
        if not isinstance(signed, _Signed):
            return signed
        node = signed.node
        try:
            order, results = results_from_json(body)
        except SampleFormatError as exc:
            return self._refuse(400, node, "malformed", f"malformed results: {exc}")
        if self.results is None:
            return self._refuse(409, node, "no-orders", "this bot gives no enforcement orders")
        try:
            refusal = self.results(node, order, results)
        except Exception:
            log.exception("recording the results of order %d from %r failed", order, node)
            return self._refuse(
                503, node, "unavailable", "cannot record the results now", report=False
            )
        if refusal is not None:
            return self._refuse(409, node, "results-refused", refusal)
        return 200, json.dumps({"ok": True})

    def _verify(self, headers: Mapping[str, str], body: bytes) -> _Signed | tuple[int, str]:
        """Who sent a correctly signed, fresh, unreplayed request; else the refusal."""
        fields = _fields(headers)
        node = fields.get("x-gpubot-node", "")
        token = self.tokens.get(node) if node else None
        if token is None:
            return self._refuse(401, node, "unknown-node", "unknown node")
        if len(body) > self.max_body:
            return self._refuse(413, node, "too-large", f"body over {self.max_body} bytes")
        stamp = fields.get("x-gpubot-timestamp", "")
        if not _STAMP.fullmatch(stamp):
            reason = "missing or malformed X-Gpubot-Timestamp"
            return self._refuse(401, node, "bad-timestamp", reason)
        now = self._now()
        skew = now.timestamp() - int(stamp)
        if abs(skew) > self.max_skew.total_seconds():
            limit = int(self.max_skew.total_seconds())
            reason = f"timestamp {skew:+.0f} s off the bot's clock (limit {limit} s): check NTP"
            return self._refuse(401, node, "clock-skew", reason)
        nonce = fields.get("x-gpubot-nonce", "")
        if not _NONCE.fullmatch(nonce):
            return self._refuse(401, node, "bad-nonce", "missing or malformed X-Gpubot-Nonce")
        signature = fields.get("x-gpubot-signature", "")
        if not _SIGNATURE.fullmatch(signature) or not hmac.compare_digest(
            sign(token, stamp, nonce, body), signature
        ):
            return self._refuse(401, node, "bad-signature", "bad signature")
        # Only a correctly signed request may spend a nonce, so strangers cannot fill the store.
        verdict = self._spend(node, nonce, int(stamp) + self.max_skew.total_seconds(), now)
        if verdict is not None:
            return verdict
        return _Signed(node, token, int(stamp), now)

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
        if full and not replayed:
            return self._refuse(429, node, "rate-limited", "too many pushes; slow the agent down")
        if not replayed and self.spend is not None:
            try:
                replayed = not self.spend(node, nonce, datetime.fromtimestamp(expires, UTC))
            except Exception:
                log.exception("recording a nonce of %r failed", node)
                with self._lock:
                    seen.pop(nonce, None)
                reason = "cannot record the request now; try again"
                return self._refuse(503, node, "unavailable", reason, report=False)
        if replayed:
            return self._refuse(401, node, "replayed", "replayed request (nonce already used)")
        return None

    def _now(self) -> datetime:
        now = self.clock()
        return now if now.tzinfo is not None else now.replace(tzinfo=UTC)  # freezegun is naive

    def _refuse(
        self, status: int, node: str, reason: str, message: str, *, report: bool = True
    ) -> tuple[int, str]:
        known = node in self.tokens
        self.refusals.refused(node if known else UNKNOWN, node, status, reason, message)
        if known and report and self.on_refused is not None:
            try:
                self.on_refused(node, message)
            except Exception:
                # Reporting a refusal must not turn it into a 500 for the agent.
                log.exception("on_refused failed for %r", node)
        return status, message


def _fields(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers by lower-case name; one that is not text counts as missing."""
    return {
        name.lower(): value
        for name, value in headers.items()
        if isinstance(name, str) and isinstance(value, str)
    }
