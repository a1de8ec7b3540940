"""The telemetry model: `Sample`, `ProcessInfo`, the `GpuSource` protocol, and the wire format
the node agent speaks (samples as JSON, requests signed `v1=HMAC_SHA256(token, v1:ts:nonce:body)`,
the bot's enforcement orders signed `v1=HMAC_SHA256(token, canonical JSON of the order)`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from bot.telemetry.errors import SampleFormatError

HEALTH = ("ok", "xid", "ecc", "lost")
WIRE_VERSION = 1

# The wire's bounds. Generous for any real node, tight enough that no sender can make the bot
# parse, keep or store something unbounded.
MAX_DEPTH = 8  # a samples document nests 5 deep, an order 4
MAX_SAMPLES = 1024  # one per GPU, and a node has at most MAX_INDEX + 1 of them
MAX_PROCESSES = 256  # on one GPU
MAX_TARGETS = 1024  # processes in one enforcement order
MAX_INDEX = 1023
MAX_PID = 2**22  # Linux PID_MAX_LIMIT
MAX_ID = 2**31 - 1  # order ids: an integer column on every database
MAX_EPOCH_S = 2**33  # process start times: the year 2242
_MIB = (0, 2**31 - 1)  # MiB figures go to integer columns
_NAME = (0, 128)  # node names, uuids, models, containers, jobs
_WORD = (0, 64)  # health, ISO times


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process holding a GPU context; `started` (epoch seconds) guards against PID reuse."""

    pid: int
    user: str | None = None
    container: str | None = None
    job: str | None = None
    used_mib: int | None = None
    started: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of one GPU. `error` set means the NVML call failed: the GPU is unknown."""

    node: str
    index: int
    uuid: str
    model: str
    memory_total_mib: int
    memory_used_mib: int | None
    util_pct: float | None
    temperature_c: float | None
    power_w: float | None
    health: str  # one of HEALTH
    processes: tuple[ProcessInfo, ...]
    taken_at: datetime  # aware UTC
    error: str | None = None
    driver: str | None = None  # the NVIDIA driver version, e.g. 550.54.15
    cuda: str | None = None  # the CUDA version the driver supports, e.g. 12.4
    # False where the source cannot see processes (DCGM, Prometheus): `processes` is then empty
    # for want of knowing, and node agents, where configured, supply them (see window.py).
    processes_known: bool = True

    def shifted(self, by: timedelta) -> Sample:
        """The same reading with `taken_at` moved onto another clock."""
        return replace(self, taken_at=self.taken_at + by)


class GpuSource(Protocol):
    """Anything that reads GPUs: NVML on this host, a simulated fleet, an agent's push."""

    def poll(self, now: datetime) -> list[Sample]: ...


FIELDS = (  # a sample's fields in its JSON form
    "node",
    "index",
    "uuid",
    "model",
    "memory_total_mib",
    "memory_used_mib",
    "util_pct",
    "temperature_c",
    "power_w",
    "health",
    "processes",
    "taken_at",
    "error",
    "driver",
    "cuda",
)


def to_json(samples: list[Sample]) -> bytes:
    """The document the agent POSTs: compact, versioned, datetimes as ISO 8601 with offset."""
    rows = []
    for sample in samples:
        row = {name: getattr(sample, name) for name in FIELDS}
        row["processes"] = [asdict(p) for p in sample.processes]
        row["taken_at"] = sample.taken_at.isoformat()
        rows.append(row)
    return json.dumps({"version": WIRE_VERSION, "samples": rows}, separators=(",", ":")).encode()


def from_json(body: bytes | str) -> list[Sample]:
    """Decode `to_json` output; anything else raises SampleFormatError naming the bad field.

    Every number must be finite and in its range, every string and list bounded, and the
    document at most MAX_DEPTH deep: the samples go on to the sweep, the history table and
    the audit log, and nothing a sender writes may break them.
    """
    document = load_document(body)
    if not isinstance(document, dict) or document.get("version") != WIRE_VERSION:
        raise SampleFormatError(f"expected an object with version {WIRE_VERSION}")
    rows = document.get("samples")
    if not isinstance(rows, list):
        raise SampleFormatError("expected `samples` to be a list")
    if len(rows) > MAX_SAMPLES:
        raise SampleFormatError(f"samples: at most {MAX_SAMPLES} in one push, got {len(rows)}")
    return [_sample(row, f"samples[{i}]") for i, row in enumerate(rows)]


def results_from_json(body: bytes | str) -> tuple[int, list[dict[str, Any]]]:
    """Decode the agent's `{"order": id, "results": [{"pid", "outcome"}]}`."""
    data = load_document(body)
    if not isinstance(data, dict):
        raise SampleFormatError("expected an object")
    order = data.get("order")
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_ID:
        raise SampleFormatError("order: expected an integer id")
    results = data.get("results")
    if not isinstance(results, list):
        raise SampleFormatError("results: expected a list")
    if len(results) > MAX_TARGETS:
        raise SampleFormatError(f"results: at most {MAX_TARGETS}, got {len(results)}")
    out = []
    for k, item in enumerate(results):
        if not isinstance(item, dict):
            raise SampleFormatError(f"results[{k}]: expected {{pid: int, outcome: str}}")
        pid = _get(item, "pid", _INT, f"results[{k}]", null=False, within=(1, MAX_PID))
        outcome = _get(item, "outcome", _STR, f"results[{k}]", null=False, within=(0, 4000))
        out.append({"pid": pid, "outcome": outcome[:200]})
    return order, out


def load_document(body: bytes | str) -> Any:
    """JSON from an agent or the bot, refused (SampleFormatError) when it is not JSON, when it
    nests deeper than MAX_DEPTH, or when it holds NaN or Infinity, which JSON does not know."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if _deeper_than(raw, MAX_DEPTH):
        raise SampleFormatError(f"not JSON, or nested deeper than {MAX_DEPTH}")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise SampleFormatError(f"not JSON: {_short(exc)}") from None


# What decides the nesting: brackets and the quotes around strings. Escaped backslashes and
# escaped quotes are dropped first, so that every quote left opens or closes a string.
_KEEP = bytes(b for b in range(256) if b not in b'"[]{}')
_STRING = re.compile(rb'"[^"]*(?:"|\Z)')  # closed, or running to the end of the body
_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _deeper_than(raw: bytes, limit: int) -> bool:
    """Does the body nest more than `limit` deep (or hold unbalanced brackets)? Strings are cut
    out, then each pass drops the innermost bracket pairs: all C-speed, never recursive, and
    the regular expressions only ever see the few bytes that are quotes and brackets."""
    marks = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _KEEP)
    brackets = _STRING.sub(b"", marks).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = _PAIR.sub(b"", brackets)
    return bool(brackets)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _short(value: object, limit: int = 60) -> str:
    """A sender's value or message, cut to fit one log line."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


_INT, _NUM, _STR = (int,), (int, float), (str,)


def _get(
    row: dict[str, Any],
    name: str,
    kinds: tuple[type, ...],
    where: str,
    *,
    null: bool,
    within: tuple[float, float],
) -> Any:
    """Field `name` of `row`: of one of `kinds`, and for numbers within `within`, for strings
    at most `within[1]` long."""
    value: Any = row.get(name)
    if value is None and null:
        return None
    # The exact type: JSON gives no subclasses, and bool is an int to Python, never to us.
    kind = type(value)
    if kind not in kinds:
        raise SampleFormatError(
            f"{where}.{name}: expected {kinds[-1].__name__}, got {_short(repr(value))}"
        )
    low, high = within
    if kind is str:
        if len(value) > high:
            raise SampleFormatError(f"{where}.{name}: longer than {high:.0f} characters")
    # Written so NaN fails it (every comparison with NaN is False), and no isfinite(): it
    # overflows on a 400-digit integer.
    elif not low <= value <= high:
        raise SampleFormatError(
            f"{where}.{name}: expected {low:g} to {high:g}, got {_short(repr(value))}"
        )
    return value


def _sample(row: Any, where: str) -> Sample:
    if not isinstance(row, dict):
        raise SampleFormatError(f"{where}: expected an object")
    health = _get(row, "health", _STR, where, null=False, within=_WORD)
    if health not in HEALTH:
        raise SampleFormatError(f"{where}.health: expected one of {', '.join(HEALTH)}")
    when = _get(row, "taken_at", _STR, where, null=False, within=_WORD)
    try:
        taken_at = datetime.fromisoformat(when)
    except ValueError:
        raise SampleFormatError(f"{where}.taken_at: not an ISO 8601 time") from None
    if taken_at.utcoffset() is None:
        raise SampleFormatError(f"{where}.taken_at: needs a UTC offset")
    try:
        taken_at = taken_at.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59-01:00 is past the end of time in UTC
        raise SampleFormatError(f"{where}.taken_at: out of range") from None
    processes = row.get("processes")
    if not isinstance(processes, list):
        raise SampleFormatError(f"{where}.processes: expected a list")
    if len(processes) > MAX_PROCESSES:
        raise SampleFormatError(f"{where}.processes: at most {MAX_PROCESSES}, got {len(processes)}")
    return Sample(
        node=_get(row, "node", _STR, where, null=False, within=_NAME),
        index=_get(row, "index", _INT, where, null=False, within=(0, MAX_INDEX)),
        uuid=_get(row, "uuid", _STR, where, null=False, within=_NAME),
        model=_get(row, "model", _STR, where, null=False, within=_NAME),
        memory_total_mib=_get(row, "memory_total_mib", _INT, where, null=False, within=_MIB),
        memory_used_mib=_get(row, "memory_used_mib", _INT, where, null=True, within=_MIB),
        util_pct=_get(row, "util_pct", _NUM, where, null=True, within=(0, 100)),
        temperature_c=_get(row, "temperature_c", _NUM, where, null=True, within=(-273, 1000)),
        power_w=_get(row, "power_w", _NUM, where, null=True, within=(0, 100_000)),
        health=health,
        processes=tuple(_process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes)),
        taken_at=taken_at,
        error=_get(row, "error", _STR, where, null=True, within=(0, 1000)),
        driver=_get(row, "driver", _STR, where, null=True, within=_WORD),  # older agents: none
        cuda=_get(row, "cuda", _STR, where, null=True, within=_WORD),
    )


def _process(row: Any, where: str) -> ProcessInfo:
    if not isinstance(row, dict):
        raise SampleFormatError(f"{where}: expected an object")
    return ProcessInfo(
        pid=_get(row, "pid", _INT, where, null=False, within=(1, MAX_PID)),
        user=_get(row, "user", _STR, where, null=True, within=(0, 64)),
        container=_get(row, "container", _STR, where, null=True, within=_NAME),
        job=_get(row, "job", _STR, where, null=True, within=_NAME),
        used_mib=_get(row, "used_mib", _INT, where, null=True, within=_MIB),
        started=_get(row, "started", _NUM, where, null=True, within=(0, MAX_EPOCH_S)),
    )


def sign(token: str, timestamp: str, nonce: str, body: bytes) -> str:
    """The X-Gpubot-Signature value for one request: `v1=` and a hex HMAC-SHA256."""
    message = b"v1:" + timestamp.encode() + b":" + nonce.encode() + b":" + body
    return "v1=" + hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def order_signature(token: str, order: Mapping[str, Any]) -> str:
    """The `signature` of an enforcement order: `v1=` and a hex HMAC-SHA256 over the order's
    canonical JSON (sorted keys, no spaces), every field but `signature` itself signed.
    ValueError when the order holds something JSON cannot say (NaN)."""
    unsigned = {key: value for key, value in order.items() if key != "signature"}
    canonical = json.dumps(unsigned, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "v1=" + hmac.new(token.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def sign_order(token: str, order: Mapping[str, Any]) -> dict[str, Any]:
    """`order` with its `signature`."""
    return {**order, "signature": order_signature(token, order)}
