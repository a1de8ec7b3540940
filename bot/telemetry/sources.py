"""Choosing a GPU source: NVML on this host, a simulated fleet, or `auto` (NVML when it finds
GPUs, else the simulated fleet, so a laptop demo and a GPU node run the same command).
"""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from bot.telemetry.fleet import load_fleet
from bot.telemetry.nvml import NvmlSource, nvml_available
from bot.telemetry.simulated import SimulatedSource

log = logging.getLogger(__name__)

SourceKind = Literal["nvml", "simulated", "auto"]
DEFAULT_FLEET = Path(__file__).resolve().parents[2] / "fixtures" / "fleets" / "default.yaml"


def this_node() -> str:
    """The short host name, which is how pools.yaml names nodes."""
    return socket.gethostname().split(".")[0]


def make_source(
    kind: SourceKind,
    fleet_path: Path | str | None = None,
    node_name: str | None = None,
    *,
    start: datetime | None = None,
) -> NvmlSource | SimulatedSource:
    """`simulated` replays `fleet_path` (default: fixtures/fleets/default.yaml) from `start`
    (default: now), every node of it unless `node_name` picks one; `nvml` reads this host as
    `node_name` (default: the host name). Bad fleet files raise FleetError."""
    if kind == "auto":
        kind = "nvml" if nvml_available() else "simulated"
        log.info("telemetry source: %s (auto)", kind)
    if kind == "nvml":
        return NvmlSource(node_name or this_node())
    if kind != "simulated":
        raise ValueError(f"unknown telemetry source {kind!r}: nvml, simulated or auto")
    fleet = load_fleet(fleet_path or DEFAULT_FLEET)
    return SimulatedSource(fleet, start or datetime.now(UTC), node=node_name)
