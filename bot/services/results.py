"""What the use cases hand back: plain, immutable views of leases, requests and results.

Expected "no" answers are values (`Refused`, a denied outcome), never exceptions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from rules.domain import Outcome
from rules.reports import Usage


@dataclass(frozen=True, order=True)
class GpuSlot:
    node: str
    index: int


@dataclass(frozen=True)
class LeaseView:
    id: int
    holder: str
    team: str
    pool: str
    gpus: tuple[GpuSlot, ...]
    state: str
    priority: str
    protected: bool
    reason: str
    granted_at: datetime
    expires_at: datetime
    extensions: int
    extended: timedelta
    ended_at: datetime | None = None
    end_reason: str = ""
    recalled_for: str = ""  # "vision (R4)" while a lender recall is under way
    recalled_within_team: bool = False  # recalled (now or before it ended) for its own team
    # At its grant only: its GPUs ("node:index") that had no fresh telemetry to vouch for them.
    unknown: tuple[str, ...] = ()

    @property
    def code(self) -> str:
        return f"L{self.id}"

    @property
    def by_node(self) -> dict[str, list[int]]:
        """GPU indices per host, the shape CUDA_VISIBLE_DEVICES wants."""
        nodes: dict[str, list[int]] = defaultdict(list)
        for slot in sorted(self.gpus):
            nodes[slot.node].append(slot.index)
        return dict(nodes)

    def cuda_visible_devices(self, node: str) -> str:
        return ",".join(str(i) for i in self.by_node.get(node, []))

    @property
    def ended_how(self) -> str:
        return ended_how(self.state, self.end_reason, within_team=self.recalled_within_team)


#: How a reclaimed lease ended, by its end reason, in its holder's words.
_RECLAIMED_BECAUSE = {
    "expired": "it expired",
    "idle": "its GPUs stayed idle after the warning",
    "preempted": "its lender needs the GPUs back",
    "unhealthy": "a GPU failed",
}


def reader_time(at: datetime) -> str:
    """A moment in a message the services compose, shown in each reader's own zone (Slack's
    date markup), with the UTC time as the fallback for clients that cannot draw it."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    fallback = f"{aware.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    return f"<!date^{int(aware.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def ended_how(state: str, end_reason: str, *, within_team: bool = False) -> str:
    """ "released", "reclaimed because it expired": how a lease ended, for people
    (`within_team`: it was recalled for a higher-priority request of its own team)."""
    if state == "reclaimed" and end_reason == "preempted" and within_team:
        return "reclaimed because a higher-priority request of its team needed the GPUs"
    if state == "reclaimed":
        return f"reclaimed because {_RECLAIMED_BECAUSE.get(end_reason, end_reason)}"
    return str(state)


@dataclass(frozen=True)
class RequestView:
    id: int
    kind: str
    requester: str
    team: str
    pool: str
    gpus: int
    duration: timedelta
    priority: str
    reason: str
    state: str
    outcome: str
    approvers: tuple[str, ...]
    approval_route: str  # a channel id, or "managers" for DMs
    lease_id: int | None
    created_at: datetime
    decided_at: datetime | None = None
    decided_by: str | None = None
    escalated_at: datetime | None = None  # the approval lifecycle escalated it then
    reminders: int = 0  # how often the approvers were reminded

    @property
    def code(self) -> str:
        return f"R{self.id}"


@dataclass(frozen=True)
class Refused:
    """The use case did nothing; `message` tells the person why and how to go on."""

    message: str
    code: str = "refused"


@dataclass(frozen=True)
class BorrowResult:
    outcome: Outcome
    request: RequestView
    because: str
    deciding: str
    lease: LeaseView | None = None


@dataclass(frozen=True)
class SettleResult:
    """A manager's approve or deny: what became of the request, and of its lease if any."""

    request: RequestView
    lease: LeaseView | None
    message: str
    already_settled: bool = False


@dataclass(frozen=True)
class ExtendResult:
    outcome: Outcome
    lease: LeaseView
    because: str
    deciding: str
    request: RequestView | None = None


@dataclass(frozen=True)
class ReleaseResult:
    released: tuple[LeaseView, ...]
    cancelled: tuple[RequestView, ...] = ()


@dataclass(frozen=True)
class ShrinkResult:
    """A lease that gave back some GPUs and runs on with the rest (`lease`, as it is now)."""

    lease: LeaseView
    given_back: tuple[GpuSlot, ...]
    started: tuple[LeaseView, ...] = ()  # waiting requests the freed GPUs started


@dataclass(frozen=True)
class Explanation:
    """The stored reasons behind a request or a lease, newest last."""

    subject: str
    summary: str
    lines: tuple[str, ...] = field(default=())
    # A waiting guarantee: the borrowed leases that cannot be recalled for it now, and why.
    passed_over: tuple[PassedOver, ...] = ()
    title: str = ""  # what it shows: "Why L8", "Audit trail of L8"
    reason: str = ""  # the requester's reason in full (cards show it cut short)


@dataclass(frozen=True)
class ModelCount:
    """GPUs of one model in a pool, by state."""

    model: str
    free: int
    leased: int
    unhealthy: int  # unhealthy, drained or not reporting: out of service
    occupied: int = 0  # in use without a lease: a process or memory, and no lease covers it
    silent: int = 0  # of the out of service, those not reporting
    drained: int = 0  # of the out of service, those on a drained node


@dataclass(frozen=True)
class PoolStatus:
    name: str
    protected: bool
    size: int
    models: tuple[ModelCount, ...]
    queued: int
    stranded: int = 0  # free GPUs on nodes where no waiting request fits

    @property
    def free(self) -> int:
        return sum(m.free for m in self.models)

    @property
    def leased(self) -> int:
        return sum(m.leased for m in self.models)

    @property
    def unhealthy(self) -> int:
        return sum(m.unhealthy for m in self.models)

    @property
    def occupied(self) -> int:
        return sum(m.occupied for m in self.models)

    @property
    def silent(self) -> int:
        return sum(m.silent for m in self.models)

    @property
    def drained(self) -> int:
        return sum(m.drained for m in self.models)


@dataclass(frozen=True)
class FairShareUse:
    """One team's fair share in one pool (rules.fairshare): what it is owed among borrowers,
    its weight against the pool's, and its recent use against the pool's."""

    weight: float
    weights: float  # the weights of every team with a quota in the pool, added up
    weight_share: float
    usage: float  # GPU-hours, each counting half after every `half_life`
    usage_share: float  # of the pool's teams' usage; 0 when nobody used any
    half_life: timedelta


@dataclass(frozen=True)
class QuotaUse:
    """One team in one pool: what it is guaranteed, may borrow, lends, and holds now; its fair
    share when asked for and fair share is on."""

    team: str
    pool: str
    nominal: int
    borrowing_limit: int
    lending_limit: int
    used: int
    fair_share: FairShareUse | None = None

    @property
    def borrowed(self) -> int:
        return max(0, self.used - self.nominal)


@dataclass(frozen=True)
class Home:
    """What a person sees on the bot's App Home tab."""

    user: str
    team: str | None
    leases: tuple[LeaseView, ...]
    requests: tuple[RequestView, ...]
    quotas: tuple[QuotaUse, ...]
    pools: tuple[PoolStatus, ...]
    paused: bool = False
    admin: bool = False
    places: Mapping[int, int] = field(default_factory=dict)  # queued request id -> place
    week: WeekUse | None = None
    waiting: tuple[RequestView, ...] = ()  # for this person's decision, oldest first
    managed: tuple[TeamWork, ...] = ()  # the teams this person manages
    fleet: Fleet | None = None  # admins only

    @property
    def manager(self) -> bool:
        return bool(self.managed)


@dataclass(frozen=True)
class WeekUse:
    """A person's last 7 days: GPU time held, used, idle and unknown, and its cost (`priced`:
    some pool has a price)."""

    usage: Usage
    currency: str = "USD"
    priced: bool = False


@dataclass(frozen=True)
class TeamWork:
    """One team a manager looks after: its active leases and open requests."""

    team: str
    leases: tuple[LeaseView, ...]
    requests: tuple[RequestView, ...]


@dataclass(frozen=True)
class UnreservedGpu:
    """A GPU with processes on it that no lease covers."""

    node: str
    index: int
    pool: str
    users: tuple[str, ...]  # the Unix users seen ("" when unnamed)


@dataclass(frozen=True)
class Fleet:
    """What an admin watches: drained and not-reporting nodes, unreserved use, the queue."""

    drained: tuple[str, ...]
    silent: tuple[str, ...]
    unreserved: tuple[UnreservedGpu, ...]
    queue: tuple[RequestView, ...]


@dataclass(frozen=True)
class Recalled:
    """A borrowed lease a recall takes back (or would take back)."""

    lease: int
    holder: str
    gpus: int
    team: str


@dataclass(frozen=True)
class ApprovalEffects:
    """What approving a request would do, as of now."""

    queued: int  # requests waiting in the pool
    overtakes: tuple[int, ...] = ()  # granted at once, ahead of these queued requests
    waits: bool = False  # no GPUs for it now: it would join the queue
    behind: tuple[int, ...] = ()  # ... behind these
    recalls: tuple[Recalled, ...] = ()  # ... and recall these borrowed leases
    notice: timedelta = timedelta(0)  # the recall's notice period
    refused: str = ""  # the rules would now deny it: why
    waits_for: str = ""  # the rule that keeps it waiting even once approved
    paused: bool = False  # automation is paused: no recall starts
    held_for: tuple[HeldFor, ...] = ()  # lenders' waiting guarantees it may not borrow from
    preempts: tuple[Recalled, ...] = ()  # ... and preempt these lower-priority leases of its team


@dataclass(frozen=True)
class HeldFor:
    """GPUs a lender's waiting request inside its nominal counts on: not lendable."""

    request: int
    team: str
    gpus: int


@dataclass(frozen=True)
class PassedOver:
    """A borrowed lease recall may not take now, and why (protected, too young, cooldown)."""

    lease: Recalled
    why: str


@dataclass(frozen=True)
class Recall:
    """A recall under way: the lease, and when its GPUs are taken (None: not warned yet)."""

    lease: Recalled
    taken_at: datetime | None
    request: int = 0  # the waiting request it makes room for
    within_team: bool = False  # a lower-priority lease of that request's own team


@dataclass(frozen=True)
class QueueEntry:
    """One waiting request: its place in its pool's queue and why it waits there."""

    request: RequestView
    position: int  # its place in its pool's serving order, from 1
    head: str  # the code of the head of its team's queue when this one is behind it, else ""
    waits_for: str  # the rules' reason it waits (what is missing)
    free: int  # GPUs free in the pool now
    guaranteed: bool  # inside its team's nominal: borrowed GPUs are recalled for it
    recalls: tuple[Recall, ...]  # recalls under way for it
    withdrawn_at: datetime  # when it times out if still waiting
    passed_over: tuple[PassedOver, ...] = ()  # borrowed leases recall may not take now (guaranteed)
    expected_start: datetime | None = None  # from the leases' end times (None: not known)
    for_gpus: bool = True  # it waits for GPUs to come free (else only for the rules)
    share: FairShareUse | None = None  # its team's fair share, when it borrows
    backfill: str = "reserve"  # the pool's queue.backfill: who may start before it
    passed_within: tuple[PassedOver, ...] = ()  # its team's lower-priority leases, likewise
