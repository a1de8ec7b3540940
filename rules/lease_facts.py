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


# A GpuSnapshot's fields in order, as a plain tuple: (id, node, index, model, pool, state,
# drained, lease_id).
GpuLine = tuple[int, str, int, str, str, str, bool, int | None]


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


@dataclass(frozen=True)
class _Timing:
    """What the policy's timing gives every lease alike, worked out once per revision."""

    leads: tuple[timedelta, ...]  # expiry lead times, nearest first
    idle_threshold: timedelta
    idle_threshold_min: float
    grace_min: float
    notice_min: float


# The last revision's (timing, recall) and what they give: one revision is in force at a time.
_worked_out: dict[str, tuple[object, object, _Timing]] = {}


def _timing_of(policy: Policy) -> _Timing:
    # Timing and Recall are frozen values: the same objects give the same figures.
    timing, recall = policy.timing, policy.recall
    last = _worked_out.get("last")
    if last is not None and last[0] is timing and last[1] is recall:
        return last[2]
    worked = _Timing(
        tuple(sorted(timing.expiry_leads)),
        timing.idle_threshold,
        minutes(timing.idle_threshold),
        minutes(timing.grace),
        minutes(recall.notice),
    )
    _worked_out["last"] = (timing, recall, worked)
    return worked


_ZERO = timedelta(0)


# What one walk over a lease's readings found (see `_walk`): fresh, unhealthy, intruded, the
# least idle time of any reading, the GPUs judged idle and busy as gpu_idleness judges them,
# and how long the idle ones have all been idle.
_Walk = tuple[bool, bool, bool, timedelta | None, int, int, timedelta | None]


def _walk(
    policy: Policy,
    lease: LeaseSnapshot,
    readings: Sequence[Reading | None],
    age: timedelta,
    threshold: timedelta,
) -> _Walk:
    """The lease's freshness, health, intruders and least idle time, and each GPU idle or busy
    as gpu_idleness judges it, in one walk over the readings (in locals: 50,000 leases a
    pass)."""
    fresh, unhealthy, intruded = bool(readings), False, False
    least: timedelta | None = None
    idle_gpus = busy_gpus = 0
    idle_gpus_for: timedelta | None = None
    for r in readings:
        if r is None:
            fresh = False
            continue
        idle = r.idle_for
        if least is None or idle < least:
            least = idle
        if not r.healthy:
            unhealthy = True
        if not r.fresh:
            fresh = False
            continue  # unknown: neither idle nor busy
        if not intruded and r.processes:
            intruded = _intrudes(policy, lease.holder, r.processes)
        span = idle if idle < age else age
        if span > _ZERO and span >= threshold:
            idle_gpus += 1
            if idle_gpus_for is None or span < idle_gpus_for:
                idle_gpus_for = span
        else:
            busy_gpus += 1
    if len(readings) > len(lease.slots):  # only the slots' own readings are judged per GPU
        per_gpu = gpu_idleness(policy, lease, readings, lease.granted_at + age)
        idle_gpus, busy_gpus = len(per_gpu.idle), len(per_gpu.busy)
        idle_gpus_for = per_gpu.idle_for if per_gpu.idle else None
    return fresh, unhealthy, intruded, least, idle_gpus, busy_gpus, idle_gpus_for


def _intrudes(policy: Policy, holder: str, processes: Sequence[Any]) -> bool:
    """Does a process run that a lease held by `holder` does not cover (as `covers` judges)?"""
    for p in processes:
        user = getattr(p, "user", None)
        if user and user != holder and policy.accounts.get(user) != holder:
            return True
    return False


def _stage(timing: _Timing, left: timedelta) -> float | None:
    """expiry_stage, with the leads sorted once: the nearest lead crossed is the first."""
    for lead in timing.leads:
        if left <= lead:
            return minutes(lead)
    return 0.0 if left <= _ZERO else None


def lease_facts(
    policy: Policy,
    lease: LeaseSnapshot,
    readings: Sequence[Reading | None],
    warned: Warned,
    now: datetime,
) -> dict[str, Any]:
    """The lease's facts. A sweep builds these for every active lease (50,000 at 100,000
    GPUs), so the readings are walked once for the lease's and the per-GPU facts alike, what
    the policy gives every lease alike is worked out once per revision, and a lease with no
    marks and no delivered warnings (most of them) skips the reads those would need."""
    timing = _timing_of(policy)
    left = lease.expires_at - now
    stage = _stage(timing, left)
    marks = lease.warnings
    lead = marks.expiry_lead() if marks.raw else None  # no marks: no expiry warning owed
    age = max(now - lease.granted_at, _ZERO)
    fresh, unhealthy, intruded, least, idle_gpus, busy_gpus, idle_gpus_for = _walk(
        policy, lease, readings, age, timing.idle_threshold
    )
    # Idle before the lease began is not the holder's: a lease is idle for its own age at most,
    # and unknown is never idle.
    idle_for = (least if least < age else age) if fresh and least is not None else _ZERO
    delivered = warned.delivered
    if delivered:
        expiry_at, idle_at = delivered.get("expiry"), delivered.get("idle")
        preempt_at, partly_at = delivered.get("preempt"), delivered.get("partly_idle")
    else:
        expiry_at = idle_at = preempt_at = partly_at = None
    pool = policy.pools.get(lease.pool)
    # minutes(), written out: this runs 50,000 times a pass.
    return {
        # The per-GPU facts first, in the order they always had.
        "lease.idle_gpus": idle_gpus,
        "lease.busy_gpus": busy_gpus,
        "lease.partly_idle": idle_gpus > 0 and busy_gpus > 0,
        "lease.idle_gpus_for": idle_gpus_for.total_seconds() / 60 if idle_gpus_for else 0.0,
        "lease.warned.partly_idle": partly_at is not None,
        "lease.since_warned.partly_idle": (
            (now - partly_at).total_seconds() / 60 if partly_at else 0.0
        ),
        "lease.kept": marks.kept,
        "lease.id": lease.id,
        "lease.pool": lease.pool,
        "lease.team": lease.team,
        "lease.gpus": lease.gpus,
        "lease.priority": lease.priority,
        "lease.protected": lease.protected or pool is None or pool.protected,
        "lease.age": age.total_seconds() / 60,
        "lease.time_left": left.total_seconds() / 60 if left > _ZERO else 0.0,
        "lease.overdue": -left.total_seconds() / 60 if left < _ZERO else 0.0,
        "lease.expired": left <= _ZERO,
        "lease.expiry_warning_due": stage is not None and (lead is None or stage < lead),
        "lease.warned.expiry": expiry_at is not None,
        "lease.warned.idle": idle_at is not None,
        "lease.since_warned.expiry": (now - expiry_at).total_seconds() / 60 if expiry_at else 0.0,
        "lease.since_warned.idle": (now - idle_at).total_seconds() / 60 if idle_at else 0.0,
        "lease.idle": fresh and idle_for > _ZERO,
        "lease.idle_for": idle_for.total_seconds() / 60,
        "lease.snoozed": lease.snoozed_until is not None and lease.snoozed_until > now,
        "lease.unhealthy": unhealthy,
        "lease.recalled": marks.recalled,
        "lease.intruded": intruded,
        "lease.warned.preempt": preempt_at is not None,
        "lease.since_warned.preempt": (
            (now - preempt_at).total_seconds() / 60 if preempt_at else 0.0
        ),
        "telemetry.fresh": fresh,
        "limits.idle_threshold": timing.idle_threshold_min,
        "limits.grace": timing.grace_min,
        "limits.preempt_notice": timing.notice_min,
    }


def gpu_facts(gpu: GpuSnapshot, reading: Reading | None) -> dict[str, Any]:
    return gpu_line_facts(
        (gpu.id, gpu.node, gpu.index, gpu.model, gpu.pool, gpu.state, gpu.drained, gpu.lease_id),
        reading,
    )


def gpu_line_facts(line: GpuLine, reading: Reading | None) -> dict[str, Any]:
    """`gpu_facts` of a GPU given as its snapshot's fields in order: the sweep reads 100,000
    GPUs as such tuples and makes a snapshot only of those it acts on."""
    _, node, index, model, pool, state, drained, lease_id = line
    drained = drained or state == "drained"
    if reading is None:  # never seen: unknown, not faulty ("no news is not a fault")
        return {
            "gpu.node": node,
            "gpu.index": index,
            "gpu.model": model,
            "gpu.pool": pool,
            "gpu.leased": lease_id is not None,
            "gpu.util_pct": 0.0,
            "gpu.memory_used_mib": 0,
            "gpu.processes": 0,
            "gpu.unreserved": False,
            "gpu.healthy": True,
            "gpu.health": "ok",
            "gpu.idle_for": 0.0,
            "gpu.drained": drained,
            "telemetry.fresh": False,
        }
    fresh = reading.fresh  # stale is "unknown": neither idle nor unreserved
    processes = len(reading.processes)
    return {
        "gpu.node": node,
        "gpu.index": index,
        "gpu.model": model,
        "gpu.pool": pool,
        "gpu.leased": lease_id is not None,
        "gpu.util_pct": float(reading.util_pct or 0.0),
        "gpu.memory_used_mib": int(reading.memory_used_mib or 0),
        "gpu.processes": processes,
        "gpu.unreserved": fresh and processes > 0 and lease_id is None,
        "gpu.healthy": reading.healthy,
        "gpu.health": reading.health,
        "gpu.idle_for": reading.idle_for.total_seconds() / 60 if fresh else 0.0,  # minutes()
        "gpu.drained": drained,
        "telemetry.fresh": fresh,
    }
