"""The telemetry model: `Sample`, `ProcessInfo`, the `GpuSource` protocol, and the wire format
the node agent speaks (samples as JSON, requests signed `v1=HMAC_SHA256(token, v1:ts:nonce:body)`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from bot.telemetry.errors import SampleFormatError

HEALTH = ("ok", "xid", "ecc", "lost")
WIRE_VERSION = 1


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

    def shifted(self, by: timedelta) -> Sample:
        """The same reading with `taken_at` moved onto another clock."""
        return replace(self, taken_at=self.taken_at + by)


class GpuSource(Protocol):
    """Anything that reads GPUs: NVML on this host, a simulated fleet, an agent's push."""

    def poll(self, now: datetime) -> list[Sample]: ...


_FIELDS = (
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
)


def to_json(samples: list[Sample]) -> bytes:
    """The document the agent POSTs: compact, versioned, datetimes as ISO 8601 with offset."""
    rows = []
    for sample in samples:
        row = {name: getattr(sample, name) for name in _FIELDS}
        row["processes"] = [asdict(p) for p in sample.processes]
        row["taken_at"] = sample.taken_at.isoformat()
        rows.append(row)
    return json.dumps({"version": WIRE_VERSION, "samples": rows}, separators=(",", ":")).encode()


def from_json(body: bytes | str) -> list[Sample]:
    """Decode `to_json` output; anything else raises SampleFormatError naming the bad field."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SampleFormatError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("version") != WIRE_VERSION:
        raise SampleFormatError(f"expected an object with version {WIRE_VERSION}")
    rows = document.get("samples")
    if not isinstance(rows, list):
        raise SampleFormatError("expected `samples` to be a list")
    return [_sample(row, f"samples[{i}]") for i, row in enumerate(rows)]


_INT, _NUM, _STR = (int,), (int, float), (str,)


def _get(row: dict[str, Any], name: str, kinds: tuple[type, ...], where: str, *, null: bool) -> Any:
    value = row.get(name)
    if value is None and null:
        return None
    # bool is an int to Python, never to us.
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise SampleFormatError(f"{where}.{name}: expected {kinds[-1].__name__}, got {value!r}")
    return value


def _sample(row: Any, where: str) -> Sample:
    if not isinstance(row, dict):
        raise SampleFormatError(f"{where}: expected an object")
    health = _get(row, "health", _STR, where, null=False)
    if health not in HEALTH:
        raise SampleFormatError(f"{where}.health: expected one of {', '.join(HEALTH)}")
    try:
        taken_at = datetime.fromisoformat(_get(row, "taken_at", _STR, where, null=False))
    except ValueError:
        raise SampleFormatError(f"{where}.taken_at: not an ISO 8601 time") from None
    if taken_at.utcoffset() is None:
        raise SampleFormatError(f"{where}.taken_at: needs a UTC offset")
    taken_at = taken_at.astimezone(UTC)
    processes = row.get("processes")
    if not isinstance(processes, list):
        raise SampleFormatError(f"{where}.processes: expected a list")
    return Sample(
        node=_get(row, "node", _STR, where, null=False),
        index=_get(row, "index", _INT, where, null=False),
        uuid=_get(row, "uuid", _STR, where, null=False),
        model=_get(row, "model", _STR, where, null=False),
        memory_total_mib=_get(row, "memory_total_mib", _INT, where, null=False),
        memory_used_mib=_get(row, "memory_used_mib", _INT, where, null=True),
        util_pct=_get(row, "util_pct", _NUM, where, null=True),
        temperature_c=_get(row, "temperature_c", _NUM, where, null=True),
        power_w=_get(row, "power_w", _NUM, where, null=True),
        health=health,
        processes=tuple(_process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes)),
        taken_at=taken_at,
        error=_get(row, "error", _STR, where, null=True),
    )


def _process(row: Any, where: str) -> ProcessInfo:
    if not isinstance(row, dict):
        raise SampleFormatError(f"{where}: expected an object")
    return ProcessInfo(
        pid=_get(row, "pid", _INT, where, null=False),
        user=_get(row, "user", _STR, where, null=True),
        container=_get(row, "container", _STR, where, null=True),
        job=_get(row, "job", _STR, where, null=True),
        used_mib=_get(row, "used_mib", _INT, where, null=True),
        started=_get(row, "started", _NUM, where, null=True),
    )


def sign(token: str, timestamp: str, nonce: str, body: bytes) -> str:
    """The X-Gpubot-Signature value for one request: `v1=` and a hex HMAC-SHA256."""
    message = b"v1:" + timestamp.encode() + b":" + nonce.encode() + b":" + body
    return "v1=" + hmac.new(token.encode(), message, hashlib.sha256).hexdigest()
