"""Each device's record: its lifecycle events (joined, left, not reporting, back, swapped,
drained, fault, ...), appended by whoever saw them, and what admins read about the fleet
(`gpubot nodes`, `/gpu nodes`): each node's profile and where each of its GPUs stands, the
events, and the intervals of each device's life (lifecycle states and leases) for review
and cost attribution.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session

from bot.services.context import SYSTEM
from storage import leases, nodes
from storage.gpus import gpu_lines
from storage.tables import DeviceEventRow


def new_event(
    now: datetime, node: str, gpu: int | None, kind: str, detail: dict[str, Any]
) -> DeviceEventRow:
    """A lifecycle event the observer found (the caller adds it to its session)."""
    return DeviceEventRow(at=now, node=node, gpu=gpu, kind=kind, actor=SYSTEM, detail=detail)


def event(
    session: Session,
    now: datetime,
    node: str,
    gpu: int | None,
    kind: str,
    *,
    actor: str,
    **detail: Any,
) -> None:
    """Append one lifecycle event in the caller's transaction (drains, faults, inventory)."""
    session.add(DeviceEventRow(at=now, node=node, gpu=gpu, kind=kind, actor=actor, detail=detail))


@dataclass(frozen=True)
class GpuProfile:
    node: str
    index: int
    pool: str
    model: str
    uuid: str
    memory_mib: int
    place: str  # storage.gpus.Place: free, leased, occupied, silent, out
    observed: str
    since: datetime | None
    lease: str  # "L8" or ""
    team: str  # the holding team, if leased
    occupants: tuple[str, ...]
    memory_used_mib: int | None
    temperature_c: float | None
    power_w: float | None


@dataclass(frozen=True)
class NodeProfile:
    name: str
    pool: str
    drained: bool
    reporting: str
    since: datetime | None
    driver: str
    cuda: str
    gpus: tuple[GpuProfile, ...]


@dataclass(frozen=True)
class DeviceEvent:
    at: datetime
    node: str
    gpu: int | None
    kind: str
    actor: str
    detail: Mapping[str, Any]

    @property
    def device(self) -> str:
        return self.node if self.gpu is None else f"{self.node}:{self.gpu}"


def profiles(session: Session, name: str | None = None) -> list[NodeProfile]:
    """Every node (or one) with its GPUs' profile and where each stands."""
    lines = {(g.node, g.index): g for g in gpu_lines(session)}
    teams = leases.active_teams(session)
    out = []
    for node in nodes.nodes(session, name):
        gpus = []
        for gpu in nodes.gpus_by_index(session, node.id):
            line = lines.get((node.name, gpu.index))
            lease_id = line.lease_id if line else None
            gpus.append(
                GpuProfile(
                    node.name,
                    gpu.index,
                    gpu.pool,
                    gpu.model,
                    gpu.uuid or "",
                    gpu.memory_mib,
                    str(line.place) if line else "out",
                    gpu.observed,
                    gpu.observed_since,
                    f"L{lease_id}" if lease_id else "",
                    str(teams.get(lease_id, "")) if lease_id else "",
                    tuple(sorted({str(p.get("user") or "?") for p in gpu.occupants or []})),
                    gpu.memory_used_mib,
                    gpu.temperature_c,
                    gpu.power_w,
                )
            )
        out.append(
            NodeProfile(
                node.name,
                node.pool,
                node.drained,
                node.reporting,
                node.reporting_since,
                node.driver,
                node.cuda,
                tuple(gpus),
            )
        )
    return out


def history(
    session: Session,
    name: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> list[DeviceEvent]:
    """Lifecycle events, oldest first (the newest `limit` when given)."""
    rows = nodes.events(session, name, since, limit)
    return [DeviceEvent(r.at, r.node, r.gpu, r.kind, r.actor, dict(r.detail)) for r in rows]


@dataclass(frozen=True)
class Interval:
    """One stretch of a device's life, for review and cost attribution: a lifecycle state from
    an event until the next one on the same device, or a lease holding the GPU (`team` set)."""

    node: str
    gpu: int | None
    pool: str
    state: str  # joined, not-reporting, back, drained, fault, ... or leased
    team: str
    lease: str
    start: datetime
    end: datetime | None  # None: still so
    by: str
    detail: Mapping[str, Any]


def intervals(session: Session, since: datetime | None = None) -> list[Interval]:
    """Every device's lifecycle and lease intervals that reach past `since`, by device."""
    pools = nodes.pools_of_nodes(session)
    out: list[Interval] = []
    following: dict[tuple[str, int | None], datetime] = {}  # the next event's time, per device
    for ev in reversed(history(session)):
        end = following.get((ev.node, ev.gpu))
        following[(ev.node, ev.gpu)] = ev.at
        pool = pools.get(ev.node, "")
        out.append(
            Interval(ev.node, ev.gpu, pool, ev.kind, "", "", ev.at, end, ev.actor, ev.detail)
        )
    for node, index, pool, lease, released_at in nodes.holdings(session):
        detail = {"holder": lease.holder}
        if released_at is not None:
            detail["ended"] = "given back"  # the lease ran on without this GPU
        elif lease.state != "active":
            detail["ended"] = lease.end_reason or lease.state
        out.append(
            Interval(
                node,
                index,
                pool,
                "leased",
                lease.team,
                f"L{lease.id}",
                lease.granted_at,
                released_at or lease.ended_at,
                lease.holder,
                detail,
            )
        )
    if since is not None:
        out = [i for i in out if i.end is None or i.end >= since]
    return sorted(out, key=lambda i: (i.node, -1 if i.gpu is None else i.gpu, i.start))
