"""The fact catalogue: every name a rule may use, its type and meaning, per subject.

A rule looks at one flat fact. Derived values (team.used_after, pool.free, gpu.idle_for) are
computed by rules.facts before evaluation, so conditions never join or compute.
Durations are carried as minutes (float) and written in rules as 90m, 6h, 2d or 1h30m.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rules.domain import Subject


class FactType(StrEnum):
    NUMBER = "number"
    DURATION = "duration"
    STRING = "string"
    BOOLEAN = "boolean"


@dataclass(frozen=True)
class FactSpec:
    name: str
    type: FactType
    meaning: str
    # What a test case that does not name the fact assumes: facts added after rule files were
    # written have one, so those files' cases keep loading. None: every case must give it.
    default: bool | float | str | None = None


# Facts newer than the first rule format, and the value a case that omits them assumes.
_DEFAULTS: dict[str, bool | float | str] = {
    "lease.intruded": False,
    "lease.idle_gpus": 0,
    "lease.busy_gpus": 0,
    "lease.partly_idle": False,
    "lease.idle_gpus_for": 0.0,
    "lease.warned.partly_idle": False,
    "lease.since_warned.partly_idle": 0.0,
    "lease.kept": False,
}


N, D, S, B = FactType.NUMBER, FactType.DURATION, FactType.STRING, FactType.BOOLEAN

_REQUEST = [
    ("request.kind", S, "`borrow` or `extend`"),
    ("request.gpus", N, "GPUs asked for (for an extension: the lease's GPUs)"),
    ("request.pool", S, "pool asked for"),
    ("request.duration", D, "how long (for an extension: the extra time asked for)"),
    ("request.priority", S, "`low`, `normal` or `high`"),
    ("request.priority_rank", N, "0 for low, 1 for normal, 2 for high"),
    ("request.has_reason", B, "the requester said why (`because ...`)"),
    ("user.id", S, "Slack user id of the requester"),
    ("user.team", S, "the requester's team"),
    ("user.is_manager", B, "the requester manages that team"),
    ("user.is_admin", B, "the requester is a gpubot admin"),
    ("team.nominal", N, "the team's guaranteed GPUs in this pool"),
    ("team.borrowing_limit", N, "most GPUs the team may take beyond nominal"),
    ("team.lending_limit", N, "most of its unused nominal the team lends to others"),
    ("team.limit", N, "nominal + borrowing_limit: the most the team may hold"),
    ("team.used", N, "GPUs the team holds in this pool now"),
    ("team.used_after", N, "team.used + request.gpus (extensions: team.used)"),
    ("team.borrowed_after", N, "how much of team.used_after lies beyond nominal"),
    ("pool.size", N, "GPUs in the pool"),
    ("pool.free", N, "GPUs free, healthy and not drained right now"),
    ("pool.lendable", N, "unused nominal that other teams lend, within their lending limits"),
    ("pool.protected", B, "the pool is protected (never reclaimed automatically)"),
    ("pool.queued", N, "waiting requests that come first in the queue (0 for its head)"),
    ("lease.extensions", N, "extensions the lease already had (0 for a borrow)"),
    ("lease.extensions_after", N, "lease.extensions + 1 for an extension (else 0)"),
    ("lease.extended", D, "total extra time the lease already got (0m for a borrow)"),
    ("lease.extended_after", D, "lease.extended + request.duration for an extension (else 0m)"),
    ("limits.max_gpus_per_request", N, "policy limit for one request in this pool"),
    ("limits.max_duration", D, "policy limit for one borrow in this pool"),
    ("limits.max_extensions", N, "how many extensions one lease may have"),
    ("limits.max_extension_total", D, "total extra time one lease may get"),
]

_LEASE = [
    ("lease.id", N, "the lease number"),
    ("lease.pool", S, "the lease's pool"),
    ("lease.team", S, "the holder's team"),
    ("lease.gpus", N, "GPUs in the lease"),
    ("lease.priority", S, "`low`, `normal` or `high`"),
    ("lease.protected", B, "the lease or its pool is protected"),
    ("lease.age", D, "time since the lease was granted"),
    ("lease.time_left", D, "time until expiry (0m once expired)"),
    ("lease.overdue", D, "time since expiry (0m before it)"),
    ("lease.expired", B, "the expiry time has passed"),
    ("lease.expiry_warning_due", B, "a configured expiry lead time was crossed, not yet warned"),
    ("lease.warned.expiry", B, "an expiry warning was delivered"),
    ("lease.warned.idle", B, "an idle warning was delivered and still stands"),
    ("lease.since_warned.expiry", D, "time since the last expiry warning was delivered"),
    ("lease.since_warned.idle", D, "time since the idle warning was delivered"),
    ("lease.idle", B, "every GPU of the lease is idle, with enough samples to be sure"),
    ("lease.idle_for", D, "how long the lease's GPUs have all been idle"),
    ("lease.snoozed", B, "the holder said Still using and the snooze still runs"),
    ("lease.unhealthy", B, "a GPU of the lease is unhealthy (lost, XID, ECC)"),
    ("lease.recalled", B, "the lease holds borrowed GPUs that their lending team needs back"),
    ("lease.intruded", B, "a process of someone the lease does not cover runs on one of its GPUs"),
    ("lease.warned.preempt", B, "a preemption warning for the recall was delivered"),
    ("lease.since_warned.preempt", D, "time since the preemption warning was delivered"),
    ("lease.idle_gpus", N, "GPUs of the lease idle for the idle threshold, on fresh samples"),
    ("lease.busy_gpus", N, "GPUs of the lease with fresh samples that worked within the threshold"),
    ("lease.partly_idle", B, "some GPUs of the lease are idle and at least one is busy"),
    ("lease.idle_gpus_for", D, "how long the idle GPUs of the lease have all been idle"),
    ("lease.warned.partly_idle", B, "a partly-idle warning was delivered and still stands"),
    ("lease.since_warned.partly_idle", D, "time since the partly-idle warning was delivered"),
    ("lease.kept", B, "the holder chose Keep on a partly-idle warning: no more of them"),
    ("telemetry.fresh", B, "every GPU of the subject has recent, successful samples"),
    ("limits.idle_threshold", D, "how long idle before a warning"),
    ("limits.grace", D, "how long after a delivered warning before reclaim"),
    ("limits.preempt_notice", D, "how long after a delivered preemption warning before reclaim"),
]

_GPU = [
    ("gpu.node", S, "host name"),
    ("gpu.index", N, "device index on the host"),
    ("gpu.model", S, "model name"),
    ("gpu.pool", S, "the GPU's pool"),
    ("gpu.leased", B, "an active lease covers this GPU"),
    ("gpu.util_pct", N, "latest utilization in percent"),
    ("gpu.memory_used_mib", N, "latest memory used in MiB"),
    ("gpu.processes", N, "compute processes running on it"),
    ("gpu.unreserved", B, "processes run on it but no lease covers it"),
    ("gpu.healthy", B, "no lost-GPU, XID or ECC error"),
    ("gpu.health", S, "`ok`, `lost`, `xid` or `ecc`"),
    ("gpu.idle_for", D, "how long the GPU has been idle"),
    ("gpu.drained", B, "an admin drained its node"),
    ("telemetry.fresh", B, "the GPU has recent, successful samples"),
]

CATALOGUE: dict[Subject, dict[str, FactSpec]] = {
    subject: {
        name: FactSpec(name, kind, meaning, _DEFAULTS.get(name)) for name, kind, meaning in specs
    }
    for subject, specs in (
        (Subject.REQUEST, _REQUEST),
        (Subject.LEASE, _LEASE),
        (Subject.GPU, _GPU),
    )
}


def markdown() -> str:
    """The catalogue as the Markdown tables of rules/README.md (a test keeps them in step)."""
    lines: list[str] = []
    for subject, specs in CATALOGUE.items():
        lines += [f"### `on: {subject}`", "", "| fact | type | meaning |", "|---|---|---|"]
        lines += [f"| `{s.name}` | {s.type} | {s.meaning}{_omitted(s)} |" for s in specs.values()]
        lines.append("")
    return "\n".join(lines)


def _omitted(spec: FactSpec) -> str:
    if spec.default is None:
        return ""
    value = str(spec.default).lower() if isinstance(spec.default, bool) else spec.default
    if spec.type == FactType.DURATION:
        value = f"{spec.default:g}m"
    return f" (a test case may leave it out: `{value}`)"
