"""The flat facts the sweep rules look at: one per active lease and one per GPU.

Telemetry arrives as readings (see `Reading`); a missing or stale reading makes the subject's
`telemetry.fresh` false, and nothing that is not fresh is ever idle (invariant 3). Per GPU, a
lease's GPU is idle (idle for the idle threshold), busy (fresh, and worked within it) or unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from rules.facts import minutes
from rules.marks import Marks
from rules.policy import Policy


class Reading(Protocol):
    """What telemetry says about one GPU now (the telemetry window's `GpuReading`)."""

    @property
    def fresh(self) -> bool: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def health(self) -> str: ...
    @property
    def util_pct(self) -> float | None: ...
    @property
    def memory_used_mib(self) -> int | None: ...
    @property
    def processes(self) -> Sequence[Any]: ...
    @property
    def idle_for(self) -> timedelta: ...


class Readings(Protocol):
    """Telemetry for the whole fleet: one reading per GPU, or None where none was taken."""

    def gpu(self, node: str, index: int, now: datetime) -> Reading | None: ...


@dataclass(frozen=True)
class LeaseSnapshot:
    id: int
    holder: str
    team: str
    pool: str
    gpus: int
    priority: str
    protected: bool
    granted_at: datetime
    expires_at: datetime
    warnings: Marks
    snoozed_until: datetime | None
    slots: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class GpuSnapshot:
    id: int
    node: str
    index: int
    model: str
    pool: str
    state: str
    drained: bool
    lease_id: int | None


@dataclass(frozen=True)
class Warned:
    """The warnings a lease was sent, by reason, and when each was delivered (None: not yet)."""

    delivered: Mapping[str, datetime | None] = field(default_factory=dict)

    def at(self, reason: str) -> datetime | None:
        return self.delivered.get(reason)


def covers(policy: Policy, holder: str, unix_user: str | None) -> bool:
    """Does a lease held by `holder` (a Slack id) cover a process of `unix_user`? A process
    whose user cannot be named (None) is given the benefit of the doubt."""
    if not unix_user:
        return True
    return policy.accounts.get(unix_user) == holder or unix_user == holder


def expiry_stage(policy: Policy, lease: LeaseSnapshot, now: datetime) -> float | None:
    """The most urgent lead time crossed, in minutes (0 once expired with no lead configured)."""
    left = lease.expires_at - now
    crossed = [lead for lead in policy.timing.expiry_leads if left <= lead]
    if crossed:
        return minutes(min(crossed))
    return 0.0 if left <= timedelta(0) else None


@dataclass(frozen=True)
class GpuIdleness:
    """A lease's GPUs judged one by one: idle for the idle threshold, busy, or unknown (no
    fresh reading: neither). `idle_for`: how long the idle ones have all been idle."""

    idle: tuple[tuple[str, int], ...] = ()
    busy: tuple[tuple[str, int], ...] = ()
    idle_for: timedelta = timedelta(0)

    @property
    def partly_idle(self) -> bool:
        return bool(self.idle) and bool(self.busy)


def gpu_idleness(
    policy: Policy, lease: LeaseSnapshot, readings: Sequence[Reading | None], now: datetime
) -> GpuIdleness:
    """Each GPU as lease idleness judges the whole lease: idle only on a fresh reading, and
    for the lease's own age at most. `readings` are in the order of `lease.slots`."""
    age = max(timedelta(0), now - lease.granted_at)
    idle: list[tuple[str, int]] = []
    busy: list[tuple[str, int]] = []
    spans: list[timedelta] = []
    for slot, reading in zip(lease.slots, readings, strict=False):
        if reading is None or not reading.fresh:
            continue  # unknown: neither idle nor busy
        span = min(reading.idle_for, age)
        if span > timedelta(0) and span >= policy.timing.idle_threshold:
            idle.append(slot)
            spans.append(span)
        else:
            busy.append(slot)
    return GpuIdleness(tuple(idle), tuple(busy), min(spans, default=timedelta(0)))


def lease_facts(
    policy: Policy,
    lease: LeaseSnapshot,
    readings: Sequence[Reading | None],
    warned: Warned,
    now: datetime,
) -> dict[str, Any]:
    left = lease.expires_at - now
    stage = expiry_stage(policy, lease, now)
    lead = lease.warnings.expiry_lead()
    due = stage is not None and (lead is None or stage < lead)
    # One walk over the readings (a sweep builds these facts for every active lease).
    fresh, unhealthy, intruded = bool(readings), False, False
    least: timedelta | None = None
    for r in readings:
        if r is None:
            fresh = False
            continue
        if least is None or r.idle_for < least:
            least = r.idle_for
        if not r.healthy:
            unhealthy = True
        if not r.fresh:
            fresh = False
        elif not intruded:
            intruded = any(
                not covers(policy, lease.holder, getattr(p, "user", None)) for p in r.processes
            )
    idle_for = least if least is not None else timedelta(0)
    # Idle before the lease began is not the holder's: a lease is idle for its own age at most.
    idle_for = min(idle_for, max(timedelta(0), now - lease.granted_at))
    if not fresh:
        idle_for = timedelta(0)  # unknown is never idle
    expiry_at, idle_at = warned.at("expiry"), warned.at("idle")
    preempt_at = warned.at("preempt")
    return {
        **_per_gpu(policy, lease, readings, warned, now),
        "lease.id": lease.id,
        "lease.pool": lease.pool,
        "lease.team": lease.team,
        "lease.gpus": lease.gpus,
        "lease.priority": lease.priority,
        "lease.protected": lease.protected
        or policy.pools.get(lease.pool) is None
        or policy.pools[lease.pool].protected,
        "lease.age": minutes(max(timedelta(0), now - lease.granted_at)),
        "lease.time_left": minutes(max(timedelta(0), left)),
        "lease.overdue": minutes(max(timedelta(0), -left)),
        "lease.expired": left <= timedelta(0),
        "lease.expiry_warning_due": due,
        "lease.warned.expiry": expiry_at is not None,
        "lease.warned.idle": idle_at is not None,
        "lease.since_warned.expiry": minutes(now - expiry_at) if expiry_at else 0.0,
        "lease.since_warned.idle": minutes(now - idle_at) if idle_at else 0.0,
        "lease.idle": fresh and idle_for > timedelta(0),
        "lease.idle_for": minutes(idle_for),
        "lease.snoozed": lease.snoozed_until is not None and lease.snoozed_until > now,
        "lease.unhealthy": unhealthy,
        "lease.recalled": lease.warnings.recalled,
        "lease.intruded": intruded,
        "lease.warned.preempt": preempt_at is not None,
        "lease.since_warned.preempt": minutes(now - preempt_at) if preempt_at else 0.0,
        "telemetry.fresh": fresh,
        "limits.idle_threshold": minutes(policy.timing.idle_threshold),
        "limits.grace": minutes(policy.timing.grace),
        "limits.preempt_notice": minutes(policy.recall.notice),
    }


def _per_gpu(
    policy: Policy,
    lease: LeaseSnapshot,
    readings: Sequence[Reading | None],
    warned: Warned,
    now: datetime,
) -> dict[str, Any]:
    gpus = gpu_idleness(policy, lease, readings, now)
    partly_at = warned.at("partly_idle")
    return {
        "lease.idle_gpus": len(gpus.idle),
        "lease.busy_gpus": len(gpus.busy),
        "lease.partly_idle": gpus.partly_idle,
        "lease.idle_gpus_for": minutes(gpus.idle_for),
        "lease.warned.partly_idle": partly_at is not None,
        "lease.since_warned.partly_idle": minutes(now - partly_at) if partly_at else 0.0,
        "lease.kept": lease.warnings.kept,
    }


def gpu_facts(gpu: GpuSnapshot, reading: Reading | None) -> dict[str, Any]:
    fresh = reading is not None and reading.fresh
    processes = len(reading.processes) if reading is not None else 0
    healthy = reading is None or reading.healthy  # no news is not a fault; stale is "unknown"
    return {
        "gpu.node": gpu.node,
        "gpu.index": gpu.index,
        "gpu.model": gpu.model,
        "gpu.pool": gpu.pool,
        "gpu.leased": gpu.lease_id is not None,
        "gpu.util_pct": float(reading.util_pct or 0.0) if reading is not None else 0.0,
        "gpu.memory_used_mib": int(reading.memory_used_mib or 0) if reading is not None else 0,
        "gpu.processes": processes,
        "gpu.unreserved": fresh and processes > 0 and gpu.lease_id is None,
        "gpu.healthy": healthy,
        "gpu.health": reading.health if reading is not None else "ok",
        "gpu.idle_for": minutes(reading.idle_for) if fresh and reading is not None else 0.0,
        "gpu.drained": gpu.drained or gpu.state == "drained",
        "telemetry.fresh": fresh,
    }
