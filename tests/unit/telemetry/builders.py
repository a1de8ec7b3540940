"""Builders for the telemetry tests: fleet files, samples at offsets from a literal start, and
an Ingest on a settable clock that signs what it is given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.telemetry.agent_push import Ingest, Spend
from bot.telemetry.model import ProcessInfo, Sample, sign, to_json
from bot.telemetry.window import TelemetryWindow

ROOT = Path(__file__).resolve().parents[3]
FLEETS = ROOT / "fixtures" / "fleets"
START = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)
NODE = "a100-node-01"
TOKEN = "4f1c8a2e9b7d6c5e4f3a2b1c0d9e8f7a"  # noqa: S105 - a test fixture, not a credential


def at(minutes: float = 0.0, seconds: float = 0.0) -> datetime:
    return START + timedelta(minutes=minutes, seconds=seconds)


def a_sample(**overrides: Any) -> Sample:
    """An ok, idle sample of a100-node-01 GPU 0 taken at START unless overridden."""
    fields: dict[str, Any] = {
        "node": "a100-node-01",
        "index": 0,
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_total_mib": 81920,
        "memory_used_mib": 0,
        "util_pct": 0.0,
        "temperature_c": 31.0,
        "power_w": 61.5,
        "health": "ok",
        "processes": (),
        "taken_at": START,
        "error": None,
    }
    fields.update(overrides)
    return Sample(**fields)


def a_process(**overrides: Any) -> ProcessInfo:
    fields: dict[str, Any] = {"pid": 4242, "user": "alice", "used_mib": 1024}
    fields.update(overrides)
    return ProcessInfo(**fields)


class IngestRig:
    """An Ingest on a settable clock, recording what it reported refused."""

    def __init__(self, spend: Spend | None = None) -> None:
        self.now = START
        self.telemetry = TelemetryWindow(stale_after=timedelta(minutes=3), clock=lambda: self.now)
        self.refused: list[tuple[str, str]] = []
        self.ingest = Ingest(
            {NODE: TOKEN, "l40s-node-01": "0" * 32},
            self.telemetry,
            lambda: self.now,
            lambda node, reason: self.refused.append((node, reason)),
            spend=spend,
        )

    def headers(
        self,
        body: bytes,
        *,
        node: str = NODE,
        token: str = TOKEN,
        sent: datetime | None = None,
        nonce: str = "n-1",
    ) -> dict[str, str]:
        """The headers of `body` signed as the agent signs it."""
        stamp = str(int((sent or self.now).timestamp()))
        return {
            "X-Gpubot-Node": node,
            "X-Gpubot-Timestamp": stamp,
            "X-Gpubot-Nonce": nonce,
            "X-Gpubot-Signature": sign(token, stamp, nonce, body),
        }

    def push(
        self,
        body: bytes | None = None,
        *,
        path: str = "samples",
        node: str = NODE,
        token: str = TOKEN,
        sent: datetime | None = None,
        nonce: str = "n-1",
    ) -> tuple[int, str]:
        """A signed push (of one idle sample taken when it is sent, unless `body` is given)."""
        body = to_json([a_sample(taken_at=sent or self.now)]) if body is None else body
        headers = self.headers(body, node=node, token=token, sent=sent, nonce=nonce)
        handle = self.ingest.handle if path == "samples" else self.ingest.handle_results
        return handle(headers, body)
