"""The fleet panel: every pool, node and GPU with its utilisation, memory, holder and state, from
the bot's own telemetry, inventory and leases (what the sweep sees, not a separate model)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from bot.telemetry.window import GpuReading
from rules.domain import GpuState
from storage.gpus import GpuLine, Place
from storage.tables import GpuRow, NodeRow

if TYPE_CHECKING:
    from bot.main import Bot
    from bot.services.results import LeaseView

IDLE_BELOW_PCT = 5.0  # the telemetry's own idle threshold


def fleet_panel(bot: Bot) -> dict[str, Any]:
    """Pools -> nodes -> GPUs as plain JSON; GPUs the telemetry sees outside every pool last.
    Where each GPU stands (free, leased, in use without a lease, not reporting, out of service)
    is the placement's own answer (gpus.gpu_lines); telemetry adds utilisation and memory."""
    now = bot.services.now()
    readings = bot.telemetry.readings(now)
    held = {(s.node, s.index): lease for lease in bot.services.leases() for s in lease.gpus}
    lines = {(g.node, g.index): g for g in bot.services.fleet_lines()}
    with bot.db.read() as session:
        rows = session.exec(
            select(GpuRow, NodeRow)
            .join(NodeRow, col(GpuRow.node_id) == col(NodeRow.id))
            .order_by(col(NodeRow.name), col(GpuRow.index))
        ).all()
    nodes: dict[str, dict[str, Any]] = {}
    for gpu, node in rows:
        entry = nodes.setdefault(
            node.name,
            {
                "name": node.name,
                "pool": node.pool,
                "drained": node.drained,
                "reporting": node.reporting,
                "gpus": [],
            },
        )
        key = (node.name, gpu.index)
        reading, lease, line = readings.get(key), held.get(key), lines.get(key)
        status = _status(gpu.state, node.drained, line, reading, lease)
        total = gpu.memory_mib or (reading.memory_total_mib or 0 if reading else 0)
        entry["gpus"].append(_gpu(gpu.index, total, status, reading, lease))
    pools = []
    for name, pool in bot.services.policy.pools.items():
        members = [nodes[n] for n in sorted(pool.nodes) if n in nodes]
        counts = {"free": 0, "leased": 0, "out": 0}
        for n in members:
            for g in n["gpus"]:
                line = lines.get((n["name"], g["index"]))
                place = line.place if line is not None else Place.OUT
                bucket = {Place.FREE: "free", Place.LEASED: "leased"}.get(place, "out")
                counts[bucket] += 1
        pools.append(
            {"name": name, "model": pool.model, "protected": pool.protected, "nodes": members}
            | counts
        )
    known = {(n, g["index"]) for n, entry in nodes.items() for g in entry["gpus"]}
    strays: dict[str, dict[str, Any]] = {}
    for (node_name, index), reading in sorted(readings.items()):
        if (node_name, index) not in known:
            entry = strays.setdefault(node_name, {"name": node_name, "drained": False, "gpus": []})
            status = "unreserved" if reading.processes else "unknown"
            entry["gpus"].append(_gpu(index, reading.memory_total_mib or 0, status, reading, None))
    return {"pools": pools, "outside": list(strays.values()), "paused": bot.services.paused()}


def _status(
    state: str,
    drained: bool,
    line: GpuLine | None,
    reading: GpuReading | None,
    lease: LeaseView | None,
) -> str:
    """drained, unhealthy, silent (not reporting), unknown, busy, idle (leased, computing
    nothing), unreserved (in use without a lease), free."""
    if drained or state == GpuState.DRAINED:
        return "drained"
    if state == GpuState.UNHEALTHY or (reading is not None and not reading.healthy):
        return "unhealthy"
    if line is not None and line.place == Place.SILENT:
        return "silent"
    if lease is not None and reading is not None and not reading.unknown:
        computing = reading.util_pct is not None and reading.util_pct >= IDLE_BELOW_PCT
        return "busy" if computing else "idle"
    if line is not None and line.place == Place.OCCUPIED:
        return "unreserved"
    if reading is None or reading.unknown or (line is not None and line.observed != "empty"):
        return "unknown"
    return "free"


def _gpu(
    index: int,
    memory_mib: int,
    status: str,
    reading: GpuReading | None,
    lease: LeaseView | None,
) -> dict[str, Any]:
    users = sorted({p.user for p in reading.processes if p.user}) if reading else []
    return {
        "index": index,
        "status": status,
        "util_pct": reading.util_pct if reading else None,
        "memory_used_mib": reading.memory_used_mib if reading else None,
        "memory_total_mib": memory_mib,
        "idle_min": int(reading.idle_for.total_seconds() // 60) if reading else 0,
        "users": users,
        "lease": None
        if lease is None
        else {
            "code": lease.code,
            "holder": lease.holder,
            "team": lease.team,
            "expires_at": lease.expires_at.timestamp(),
            "protected": lease.protected,
        },
    }
