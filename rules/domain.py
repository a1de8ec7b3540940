"""The domain vocabulary shared by every layer: outcomes, actions, lease states, priorities."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum


class Outcome(StrEnum):
    """What the request rules say about a borrow or an extension."""

    APPROVE = "approve"
    QUEUE = "queue"
    ASK = "ask"
    DENY = "deny"

    @property
    def severity(self) -> int:
        """How restrictive this outcome is: the most restrictive matching rule decides."""
        return _SEVERITY[self]


_SEVERITY = {Outcome.APPROVE: 0, Outcome.QUEUE: 1, Outcome.ASK: 2, Outcome.DENY: 3}


class Action(StrEnum):
    """What a sweep rule asks for about a lease or a GPU."""

    WARN = "warn"
    RECLAIM = "reclaim"
    NOTIFY = "notify"
    SHRINK = "shrink"  # give back only a lease's idle GPUs


class Reason(StrEnum):
    """Why a sweep action happens (Kueue-style machine-readable reason codes)."""

    EXPIRY = "expiry"
    IDLE = "idle"
    PARTLY_IDLE = "partly_idle"
    PREEMPT = "preempt"
    EXPIRED = "expired"
    PREEMPTED = "preempted"
    UNHEALTHY = "unhealthy"
    UNRESERVED = "unreserved"
    ADMINS = "admins"


#: Which reasons each action accepts in a rule's `then`.
ACTION_REASONS: dict[Action, frozenset[Reason]] = {
    Action.WARN: frozenset(
        {Reason.EXPIRY, Reason.IDLE, Reason.PARTLY_IDLE, Reason.PREEMPT, Reason.UNHEALTHY}
    ),
    Action.RECLAIM: frozenset({Reason.EXPIRED, Reason.IDLE, Reason.PREEMPTED, Reason.UNHEALTHY}),
    Action.NOTIFY: frozenset(
        {Reason.ADMINS, Reason.UNHEALTHY, Reason.UNRESERVED, Reason.IDLE, Reason.EXPIRY}
    ),
    Action.SHRINK: frozenset({Reason.IDLE}),
}


class Subject(StrEnum):
    """What a rule looks at: one flat fact of one of these kinds."""

    REQUEST = "request"
    LEASE = "lease"
    GPU = "gpu"


class LeaseState(StrEnum):
    """pending -> active -> (released | reclaimed | expired), plus denied, cancelled, queued."""

    PENDING = "pending"
    QUEUED = "queued"
    ACTIVE = "active"
    RELEASED = "released"
    RECLAIMED = "reclaimed"
    EXPIRED = "expired"
    DENIED = "denied"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset(
    {
        LeaseState.RELEASED,
        LeaseState.RECLAIMED,
        LeaseState.EXPIRED,
        LeaseState.DENIED,
        LeaseState.CANCELLED,
    }
)


class RequestKind(StrEnum):
    BORROW = "borrow"
    EXTEND = "extend"


class RequestState(StrEnum):
    """A request waits for a person (pending) or for GPUs (queued), then is settled once."""

    PENDING = "pending"
    QUEUED = "queued"
    APPROVED = "approved"
    DENIED = "denied"
    CANCELLED = "cancelled"

    @property
    def is_open(self) -> bool:
        return self in (RequestState.PENDING, RequestState.QUEUED)


class Priority(StrEnum):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"

    @property
    def rank(self) -> int:
        return {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2}[self]


class GpuState(StrEnum):
    OK = "ok"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"
    DRAINED = "drained"


class Observed(StrEnum):
    """What telemetry last showed on a GPU, whatever the ledger says."""

    EMPTY = "empty"  # fresh samples: no process, memory at most the floor
    OCCUPIED = "occupied"  # a process, or memory beyond the floor
    UNKNOWN = "unknown"  # no fresh sample yet (or the reading failed)
    SILENT = "silent"  # expected to report and has not for `fleet.not_reporting_after`


class Reporting(StrEnum):
    REPORTING = "reporting"
    SILENT = "silent"
    UNKNOWN = "unknown"  # nothing expected yet: no telemetry, or still within the first polls


def format_duration(value: timedelta) -> str:
    """Render a duration the way people type one: 90m, 6h, 2d, 1d 6h."""
    minutes = int(value.total_seconds() // 60)
    if minutes <= 0:
        return "0m"
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (mins, "m")) if n]
    return " ".join(parts)


def plural(n: int, noun: str) -> str:
    """A count with its noun agreeing: 1 GPU, 2 GPUs, 1 process, 2 processes."""
    if n == 1:
        return f"{n} {noun}"
    tail = "es" if noun.endswith(("s", "sh", "ch", "x")) else "s"
    return f"{n} {noun}{tail}"
