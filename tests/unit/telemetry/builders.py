"""Builders for the telemetry tests: fleet files, samples at offsets from a literal start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.telemetry.model import ProcessInfo, Sample

ROOT = Path(__file__).resolve().parents[3]
FLEETS = ROOT / "fixtures" / "fleets"
START = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)


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
