"""`/gpu nodes`: every node with its GPUs' states, or one node GPU by GPU with its history."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from bot.services.device_records import DeviceEvent, GpuProfile, NodeProfile
from bot.slack.blocks.kit import (
    Block,
    Message,
    context,
    escape,
    header,
    listing,
    message,
    plural,
    section,
    slack_date,
)

PLACES = {
    "free": "free",
    "leased": "leased",
    "occupied": "in use without a lease",
    "silent": "not reporting",
    "out": "out of service",
}
REPORTING = {"reporting": "reporting", "silent": "*not reporting*", "unknown": "no samples yet"}


def _gib(mib: int | None) -> str:
    if mib is None:
        return "?"
    return f"{mib / 1024:.0f} GiB" if mib >= 10240 or mib == 0 else f"{mib / 1024:.1f} GiB"


def node_line(node: NodeProfile) -> str:
    counts = Counter(g.place for g in node.gpus)
    states = ", ".join(f"{n} {PLACES.get(p, p)}" for p, n in sorted(counts.items()))
    reporting = REPORTING.get(node.reporting, node.reporting)
    head = f"*{escape(node.name)}* ({escape(node.pool)}) · {reporting}"
    if node.since is not None and node.reporting == "silent":
        head += f" since {slack_date(node.since, '{time}')}"
    if node.drained:
        head += " · drained"
    model = node.gpus[0].model if node.gpus else ""
    if node.driver:
        head += f" · driver {escape(node.driver)}" + (
            f", CUDA {escape(node.cuda)}" if node.cuda else ""
        )
    return f"{head}\n{len(node.gpus)} × {escape(model) or 'GPU'}: {states or 'no GPUs'}"


def gpu_line(gpu: GpuProfile) -> str:
    parts = [f"GPU {gpu.index}: *{PLACES.get(gpu.place, gpu.place)}*"]
    if gpu.lease:
        parts.append(f"{gpu.lease} ({escape(gpu.team)})")
    if gpu.occupants:
        parts.append("processes of " + escape(", ".join(gpu.occupants)))
    memory = f"{_gib(gpu.memory_used_mib)} of {_gib(gpu.memory_mib)}" if gpu.memory_mib else ""
    for shown in (
        memory,
        f"{gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else "",
        f"{gpu.power_w:.0f} W" if gpu.power_w is not None else "",
        f"`{escape(gpu.uuid)}`" if gpu.uuid else "",
    ):
        if shown:
            parts.append(shown)
    return " · ".join(parts)


def event_line(event: DeviceEvent) -> str:
    detail = ", ".join(f"{k} {v}" for k, v in event.detail.items() if v not in (None, ""))
    who = "" if event.actor == "gpubot" else f" by <@{event.actor}>"
    tail = f" ({escape(detail)})" if detail else ""
    return f"{slack_date(event.at)} · {escape(event.device)} {escape(event.kind)}{who}{tail}"


def nodes_message(
    nodes: Sequence[NodeProfile],
    events: Sequence[DeviceEvent],
    *,
    one: bool = False,
    strays: Mapping[str, int] | None = None,
) -> Message:
    """Every node in a line; `one`: the only node given, GPU by GPU, with its latest events."""
    node = nodes[0] if one and nodes else None
    blocks: list[Block] = [header(f"Node {node.name}" if node else "Nodes")]
    if node is not None:
        blocks.append(section(node_line(node)))
        blocks += listing(node.gpus, lambda g: [section(gpu_line(g))], 16, "GPU")
        if events:
            lines = "\n".join(event_line(e) for e in events[-10:])
            blocks.append(section(f"*Latest events*\n{lines}"))
    else:
        blocks += listing(nodes, lambda n: [section(node_line(n))], 45, "node")
    if not nodes:
        blocks.append(section("No nodes are configured: add them to pools.yaml."))
    if strays:
        lines = ", ".join(
            f"`{escape(n)}` ({plural(c, 'GPU')})" for n, c in sorted(strays.items())[:20]
        )
        blocks.append(
            section(f"*Reporting, but in no pool of pools.yaml* (nothing is granted): {lines}")
        )
    blocks.append(
        context(
            "Not reporting: no telemetry for the rules' `fleet.not_reporting_after`, so out of "
            "service. `gpubot nodes --history` exports every device's history."
        )
    )
    text = "; ".join(f"{n.name}: {REPORTING.get(n.reporting, n.reporting)}" for n in nodes[:20])
    return message(escape(text or "No nodes."), blocks)
