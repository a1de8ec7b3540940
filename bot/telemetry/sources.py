"""Where `gpubot serve` gets its GPU samples: NVML on this host, node agents, DCGM exporters, a
Prometheus server, or the simulated fleet. The simulated fleet is the demo's and is never chosen
unless asked for by name: `auto` is NVML when it finds GPUs, else node agents, else nothing (and
nothing is then ever idle). DCGM and Prometheus with node agents too are hybrid: the agents
supply the processes (and enforcement), DCGM the numbers.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from bot.telemetry.dcgm import DcgmSource, load_endpoints
from bot.telemetry.errors import EndpointsError
from bot.telemetry.fleet_file import load_fleet
from bot.telemetry.nvml import NvmlSource, nvml_available
from bot.telemetry.promapi import PrometheusSource
from bot.telemetry.simulated import SimulatedSource

log = logging.getLogger(__name__)

SourceKind = Literal["auto", "nvml", "simulated", "agents", "dcgm", "prometheus"]
FeedKind = Literal["nvml", "simulated", "agents", "dcgm", "prometheus", "none"]
#: What the poll job reads: `poll(now) -> list[Sample]` and `close()`.
Source = NvmlSource | SimulatedSource | DcgmSource | PrometheusSource
#: The demo's fleet, shipped in the package: five nodes as rules/policies/pools.yaml names them.
DEFAULT_FLEET = Path(__file__).resolve().parent / "fleets" / "default.yaml"

NO_AGENTS = "no node agents are configured (GPUBOT_AGENT_TOKENS_FILE)"
BLIND = "no GPU is read, so no GPU is ever idle and nothing is reclaimed for idleness"
HYBRID = "hybrid: node agents supply the processes and enforcement"
NO_PROCESSES = (
    "processes are unknown, so there is no unreserved-use detection and no enforcement on "
    "processes (set GPUBOT_AGENT_TOKENS_FILE and run node agents for them)"
)


@dataclass(frozen=True)
class Feed:
    """What feeds the bot's telemetry: `kind` and `note` are status words for /healthz and the
    log; `source` is what the poll job reads (None: only what node agents push, if any)."""

    kind: FeedKind
    note: str
    source: Source | None = None


def this_node() -> str:
    """The short host name, which is how pools.yaml names nodes."""
    return socket.gethostname().split(".")[0]


def make_source(
    kind: Literal["nvml", "simulated"],
    fleet_path: Path | str | None = None,
    node_name: str | None = None,
    *,
    start: datetime | None = None,
) -> NvmlSource | SimulatedSource:
    """`simulated` replays `fleet_path` (default: DEFAULT_FLEET) from `start` (default: now),
    every node of it unless `node_name` picks one; `nvml` reads this host as `node_name`
    (default: the host name). Bad fleet files raise FleetError."""
    if kind == "nvml":
        return NvmlSource(node_name or this_node())
    if kind != "simulated":
        raise ValueError(f"unknown telemetry source {kind!r}: nvml or simulated")
    fleet = load_fleet(fleet_path or DEFAULT_FLEET)
    return SimulatedSource(fleet, start or datetime.now(UTC), node=node_name)


def choose(
    kind: SourceKind,
    *,
    agents: bool,
    fleet_path: Path | str | None = None,
    node_name: str | None = None,
    start: datetime | None = None,
    found: Callable[[], bool] | None = None,
    dcgm_endpoints: Path | None = None,
    prometheus_url: str | None = None,
    stale_after: timedelta | None = None,
) -> Feed:
    """The feed for GPUBOT_TELEMETRY=`kind`, `agents` saying whether node agents may push.

    `found` says whether NVML finds GPUs here (default: ask NVML). `dcgm_endpoints` and
    `prometheus_url` are GPUBOT_DCGM_ENDPOINTS_FILE and GPUBOT_PROMETHEUS_URL; `stale_after` is
    how old Prometheus's newest sample of a GPU may be. EndpointsError when the one the mode
    needs is unset or wrong. Logs the choice in one line; a bot that reads no GPU at all, or no
    process, says so as a warning."""
    if kind in ("dcgm", "prometheus"):
        feed = _remote(kind, agents, dcgm_endpoints, prometheus_url, stale_after)
    else:
        feed = _feed(
            kind,
            agents=agents,
            fleet_path=fleet_path,
            node_name=node_name,
            start=start,
            found=found or nvml_available,
        )
    if feed.kind == "none" or (feed.kind in ("dcgm", "prometheus") and not agents):
        log.warning("telemetry: %s: %s", feed.kind, feed.note)
    else:
        log.info("telemetry: %s: %s", feed.kind, feed.note)
    return feed


def _remote(
    kind: Literal["dcgm", "prometheus"],
    agents: bool,
    endpoints_file: Path | None,
    url: str | None,
    stale_after: timedelta | None,
) -> Feed:
    processes = HYBRID if agents else NO_PROCESSES
    if kind == "prometheus":
        server = PrometheusSource(url or "", stale_after=stale_after or timedelta(minutes=3))
        # /healthz says which setting, never the address: it answers anyone who asks.
        note = f"the DCGM series from Prometheus (GPUBOT_PROMETHEUS_URL); {processes}"
        return Feed("prometheus", note, server)
    if endpoints_file is None:
        raise EndpointsError(
            "GPUBOT_TELEMETRY=dcgm needs GPUBOT_DCGM_ENDPOINTS_FILE: a YAML file of `node: URL`, "
            "one DCGM exporter per node, e.g. `a100-node-01: http://a100-node-01:9400/metrics`"
        )
    endpoints = load_endpoints(endpoints_file)
    exporters = f"{len(endpoints)} DCGM exporter{'s' if len(endpoints) != 1 else ''}"
    note = f"{exporters} (GPUBOT_DCGM_ENDPOINTS_FILE); {processes}"
    return Feed("dcgm", note, DcgmSource(endpoints))


def _feed(
    kind: SourceKind,
    *,
    agents: bool,
    fleet_path: Path | str | None,
    node_name: str | None,
    start: datetime | None,
    found: Callable[[], bool],
) -> Feed:
    also = "; node agents may push too" if agents else ""
    if kind == "simulated":
        fleet = make_source("simulated", fleet_path, node_name, start=start)
        return Feed("simulated", "the demo's simulated fleet (GPUBOT_TELEMETRY=simulated)", fleet)
    if kind == "nvml" or (kind == "auto" and found()):
        how = " (auto)" if kind == "auto" else ""
        host = make_source("nvml", node_name=node_name)
        return Feed("nvml", f"this host's GPUs through NVML{how}{also}", host)
    if kind not in ("auto", "agents"):
        raise ValueError(
            f"unknown telemetry source {kind!r}: auto, nvml, simulated, agents, dcgm or prometheus"
        )
    if agents:
        return Feed("agents", "only what node agents push")
    if kind == "auto":
        return Feed("none", f"NVML finds no GPU on this host and {NO_AGENTS}: {BLIND}")
    return Feed("none", f"GPUBOT_TELEMETRY=agents but {NO_AGENTS}: {BLIND}")
