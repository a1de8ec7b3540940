"""What an owed message says now: one typed notice per outbox row, read in one transaction.

The outbox row names what a message is about; the notice is that subject as it stands when
the message goes out, with every "does it still stand?" decided here, so the Slack adapter only
draws it. None: nothing is left to say (its subject is gone, or moved past it). Replies and
Home tabs are not read here: a reply was drawn when its request was carried out, and a Home tab
is the user's `Services.home`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from bot.services import approval_lifecycle, overview, recall
from bot.services.context import SYSTEM, Context
from bot.services.reads import lease_view, request_view
from bot.services.results import ApprovalEffects, LeaseView, QuotaUse, RequestView
from rules.approvals import escalation_targets
from rules.domain import LeaseState, RequestKind, RequestState
from rules.settled import Settled, WarningShown, settled
from storage import audit, leases, outbox, requests
from storage.outbox import OutboxKind
from storage.tables import AuditRow, LeaseRow, OutboxRow, RequestRow


@dataclass(frozen=True)
class ApprovalCard:
    """A request waiting for a person, with today's numbers and the buttons to settle it;
    `escalated_to`: who it was escalated to, `escalated_after` how long after it was filed."""

    request: RequestView
    quota: QuotaUse
    effects: ApprovalEffects
    because: str
    escalated_to: tuple[str, ...] = ()
    escalated_after: timedelta | None = None


@dataclass(frozen=True)
class ApprovalReminder:
    """A request still waits: a reply in the thread of its card (`thread_ts`), or a DM.
    `by`: the requester who asked for it, "" for the bot's own reminder."""

    request: RequestView
    asked: tuple[str, ...]
    waited: timedelta
    thread_ts: str | None
    by: str


@dataclass(frozen=True)
class ExtensionWaiting:
    """The holder's DM: their extension still waits, and the lease ends unless approved."""

    request: RequestView
    asked: tuple[str, ...]
    lease_ends_at: datetime


@dataclass(frozen=True)
class SettledCard:
    """An approval card once its request is settled: no buttons. `because`: the rules' reason
    (a card that went out after its request was settled); `note`: the person's reason."""

    request: RequestView
    because: str = ""
    note: str = ""
    by_bot: bool = False  # withdrawn by the bot (expired, or its wait ran out): `note` says why


@dataclass(frozen=True)
class RequestDecided:
    """The requester's DM after a person settled their request (or it left the queue)."""

    code: str
    verdict: str  # "approve", "deny", "withdrawn", "timeout" or "expired"
    by: str
    reason: str
    state: str  # the request's state now
    # what *Ask again* files once more (not part of what the DM says)
    request_id: int = field(default=0, compare=False)
    kind: str = field(default="borrow", compare=False)
    # what was asked, restated in a denial
    request: RequestView | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Grant:
    """The holder's DM for an active lease; `unknown`: its GPUs with no fresh telemetry;
    `warned`: the warnings it stands on now ("expiry", "idle", ...), told in its thread."""

    lease: LeaseView
    unknown: tuple[str, ...]
    warned: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndedGrant:
    """A grant DM of a lease that ended (before it went out, or redrawn since): no buttons."""

    lease: LeaseView
    by: str = ""


@dataclass(frozen=True)
class LeaseWarning:
    """The warning a lease stands on now, before anything is taken."""

    lease: LeaseView
    reason: str  # "expiry", "idle", "preempt", "unhealthy"
    because: str
    grace: timedelta
    now: datetime  # the deadlines count from it
    time_left_min: float
    idle_for_min: float
    snoozes_left: int
    recall: Mapping[str, Any] | None
    notice: timedelta  # how long a recall's holder has
    idle: tuple[str, ...] = ()  # partly_idle: the idle GPUs it names ("node:index")


@dataclass(frozen=True)
class EndedWarning:
    """A warning DM of a lease that ended, redrawn without buttons."""

    lease: LeaseView
    reason: str
    because: str
    by: str


@dataclass(frozen=True)
class SettledWarning:
    """A warning of an active lease that no longer stands, redrawn without buttons: what became
    of it (`outcome`). `by`: who approved the extension that answered it ("" when the rules
    did); `until`: the lease's end (extended) or the snooze's (snoozed); `given`: the GPUs
    given back ("node:index")."""

    lease: LeaseView
    reason: str
    because: str
    outcome: Settled
    by: str = ""
    until: datetime | None = None
    given: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """What its drawing shows, as a value: drawn again only when this changes."""
        until = self.until.isoformat() if self.until else ""
        kept = ",".join(f"{g.node}:{g.index}" for g in self.lease.gpus)
        return f"{self.outcome}|{self.by}|{until}|{','.join(self.given)}|{kept}"


@dataclass(frozen=True)
class Reclaimed:
    lease: LeaseView
    reason: str
    because: str
    within_team: bool = False  # preempted for a higher-priority request of its own team


@dataclass(frozen=True)
class RecallWithdrawn:
    """The active lease warned of preemption stays: its recall is no longer needed."""

    lease: LeaseView


@dataclass(frozen=True)
class EndedByOther:
    lease: LeaseView
    by: str


@dataclass(frozen=True)
class Redraw:
    """A message already posted (channel, ts) and what it says now."""

    channel: str
    ts: str
    shows: Grant | EndedGrant | EndedWarning | SettledWarning


@dataclass(frozen=True)
class LeaseClosed:
    """An ended lease's grant and warning DMs, each to redraw; those never delivered need
    nothing (`redraws` empty)."""

    lease: LeaseView
    by: str
    redraws: tuple[Redraw, ...]


@dataclass(frozen=True)
class LeaseRedrawn:
    """An active lease's grant DM, the parent of its thread, drawn as the lease stands now
    (`redraws` empty: the grant never landed), and its warnings that no longer stand, each
    only while its drawing changed since the lease's previous redraw. `drawn`: the settled
    drawing of each such warning (by its outbox id), recorded with the redraw once delivered."""

    lease: LeaseView
    redraws: tuple[Redraw, ...]
    drawn: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AdminDigest:
    """The lines owed to one admin, in one message. `replaces`: the digest (channel, ts) to
    update in place, with the lines it showed first, while it is the admin's newest message
    from the bot; `earlier`: how many older lines no longer fit."""

    lines: tuple[str, ...]
    replaces: tuple[str, str] | None = None
    earlier: int = 0


@dataclass(frozen=True)
class UnreservedUse:
    node: str
    index: int
    pool: str
    user: str


@dataclass(frozen=True)
class AdminNotice:
    """A line for an admin, or for one person (rendered alike)."""

    text: str


Notice = (
    ApprovalCard
    | ApprovalReminder
    | ExtensionWaiting
    | SettledCard
    | RequestDecided
    | Grant
    | EndedGrant
    | LeaseWarning
    | Reclaimed
    | RecallWithdrawn
    | EndedByOther
    | LeaseClosed
    | LeaseRedrawn
    | SettledWarning
    | UnreservedUse
    | AdminNotice
    | AdminDigest
)

_REQUEST_KINDS = (
    OutboxKind.APPROVAL_CARD,
    OutboxKind.CARD_SETTLED,
    OutboxKind.REQUEST_DECIDED,
    OutboxKind.APPROVAL_REMINDER,
)
_LEASE_KINDS = (
    OutboxKind.LEASE_GRANTED,
    OutboxKind.LEASE_ENDED,
    OutboxKind.LEASE_WARNING,
    OutboxKind.LEASE_RECLAIMED,
)
_REDRAW_KINDS = (OutboxKind.RECALL_WITHDRAWN, OutboxKind.LEASE_CLOSED, OutboxKind.LEASE_REDRAWN)
# Kinds that post a message of their own where a person reads it (not redraws, Home tabs).
_POSTED = tuple(
    k
    for k in OutboxKind
    if k
    not in (
        OutboxKind.HOME,
        OutboxKind.CARD_SETTLED,
        OutboxKind.LEASE_CLOSED,
        OutboxKind.LEASE_REDRAWN,
    )
)
DIGEST_SHOWN = 30  # lines a digest shows; older ones are counted
DIGEST_UPDATES = 24  # sweeps one digest message takes in before the next starts a new one


def notice(session: Session, ctx: Context, owed: OutboxRow) -> Notice | None:
    """What the outbox row `owed` says as its subject stands now; None: nothing left to say."""
    data = owed.data
    if owed.kind in _REQUEST_KINDS:
        request = requests.get(session, int(data["request"]))
        return _about_request(session, ctx, owed, request) if request else None
    if owed.kind in (*_LEASE_KINDS, *_REDRAW_KINDS):
        lease = leases.get(session, int(data["lease"]))
        return _about_lease(session, ctx, owed, lease) if lease else None
    if owed.kind == OutboxKind.UNRESERVED_USE:
        return UnreservedUse(
            str(data["node"]), int(data["index"]), str(data["pool"]), str(data["user"])
        )
    if owed.kind in (OutboxKind.ADMIN_NOTICE, OutboxKind.NOTICE):
        return AdminNotice(str(data["text"]))
    if owed.kind == OutboxKind.ADMIN_DIGEST:
        return _digest(session, owed)
    return None


def _about_request(
    session: Session, ctx: Context, owed: OutboxRow, row: RequestRow
) -> Notice | None:
    request = request_view(row)
    pending = request.state == RequestState.PENDING
    if owed.kind == OutboxKind.REQUEST_DECIDED:
        data = owed.data
        return RequestDecided(
            request.code,
            str(data["verdict"]),
            str(data["by"]),
            str(data["reason"]),
            request.state,
            request.id,
            request.kind,
            request=request,
        )
    if owed.kind == OutboxKind.APPROVAL_REMINDER:
        return _reminder(session, ctx, owed, row) if pending else None
    by_bot = row.decided_by == SYSTEM
    if owed.kind == OutboxKind.CARD_SETTLED and not pending:
        return SettledCard(request, note=str(owed.data.get("reason") or ""), by_bot=by_bot)
    # A card drawn (or redrawn) while its request still waits shows today's numbers and buttons.
    if not pending:  # settled before its card went out
        return SettledCard(request, because=_because(session, row), by_bot=by_bot)
    quota = next(
        (q for q in overview.quota_use(session, ctx, request.team) if q.pool == request.pool),
        None,
    )
    if quota is None:
        return None
    effects = recall.effects_of_approval(ctx, session, row)
    if row.escalated_at is None:
        return ApprovalCard(request, quota, effects, _because(session, row))
    targets = escalation_targets(ctx.policy, ctx.policy.approvals_for(row.team))
    after = row.escalated_at - row.created_at
    return ApprovalCard(request, quota, effects, _because(session, row), tuple(targets), after)


def _reminder(
    session: Session, ctx: Context, owed: OutboxRow, row: RequestRow
) -> ApprovalReminder | ExtensionWaiting | None:
    request = request_view(row)
    asked = tuple(approval_lifecycle.asked(ctx.policy, row))
    if owed.data.get("to") == approval_lifecycle.REQUESTER:
        lease = leases.get(session, row.lease_id) if row.lease_id is not None else None
        if lease is None or lease.state != LeaseState.ACTIVE:
            return None
        return ExtensionWaiting(request, asked, lease.expires_at)
    thread = owed.data.get("thread_ts")
    waited = owed.created_at - row.created_at
    by = str(owed.data.get("by") or "")
    return ApprovalReminder(
        request, asked, waited, str(thread) if thread else None, "" if by == SYSTEM else by
    )


def _because(session: Session, request: RequestRow) -> str:
    """The rules' reason recorded with a request's decision ("" when none)."""
    found: AuditRow | None = audit.get(session, request.audit_id) if request.audit_id else None
    return str(found.detail.get("because", "")) if found else ""


def _about_lease(session: Session, ctx: Context, owed: OutboxRow, row: LeaseRow) -> Notice | None:
    lease = lease_view(session, row)
    data = owed.data
    active = lease.state == LeaseState.ACTIVE
    match owed.kind:
        case OutboxKind.LEASE_GRANTED:
            if not active:  # ended before its grant went out: say so rather than offer buttons
                return EndedGrant(lease)
            return _grant(owed, row, lease)
        case OutboxKind.LEASE_WARNING:
            # Superseded, or released or extended before it could go out: nothing to say.
            return _warning(ctx, owed, row, lease) if active and _stands(owed, row) else None
        case OutboxKind.RECALL_WITHDRAWN:
            return RecallWithdrawn(lease) if active else None
        case OutboxKind.LEASE_RECLAIMED:
            because = str(data.get("because") or "")
            return Reclaimed(lease, str(data["reason"]), because, bool(data.get("within_team")))
        case OutboxKind.LEASE_ENDED:
            return EndedByOther(lease, str(data["by"]))
        case OutboxKind.LEASE_CLOSED:
            return None if active else _closed(session, owed, lease)
        case OutboxKind.LEASE_REDRAWN:  # an ended lease's grant is redrawn by lease_closed
            return _redrawn(session, ctx, owed, row, lease) if active else None
    return None


def _grant(grant: OutboxRow, row: LeaseRow, lease: LeaseView) -> Grant:
    unknown = tuple(str(u) for u in grant.data.get("unknown", []))
    return Grant(lease, unknown, tuple(sorted(row.warnings.outboxes())))


def _redrawn(
    session: Session, ctx: Context, owed: OutboxRow, row: LeaseRow, lease: LeaseView
) -> LeaseRedrawn:
    kinds = (OutboxKind.LEASE_GRANTED, OutboxKind.LEASE_WARNING)
    landed = [m for m in outbox.landed(session, owed.subject, kinds) if m.channel and m.ts]
    redraws = [
        Redraw(g.channel, g.ts, _grant(g, row, lease))
        for g in landed
        if g.kind == OutboxKind.LEASE_GRANTED and g.channel and g.ts
    ]
    before = _drawn_before(session, owed)
    drawn: dict[str, str] = {}
    for shown in landed:
        if shown.kind != OutboxKind.LEASE_WARNING or not shown.channel or not shown.ts:
            continue
        now = _settled(session, ctx, shown, row, lease)
        if now is None:
            continue
        drawn[str(shown.id)] = now.key
        if before.get(str(shown.id)) != now.key:
            redraws.append(Redraw(shown.channel, shown.ts, now))
    return LeaseRedrawn(lease, tuple(redraws), drawn)


def _drawn_before(session: Session, owed: OutboxRow) -> Mapping[str, Any]:
    """What the lease's latest redraw before `owed` recorded of its settled warnings."""
    earlier = [
        r
        for r in outbox.landed(session, owed.subject, (OutboxKind.LEASE_REDRAWN,))
        if owed.id is None or (r.id is not None and r.id < owed.id)
    ]
    found = earlier[-1].data.get("drawn") if earlier else None
    return found if isinstance(found, Mapping) else {}


def _settled(
    session: Session, ctx: Context, shown: OutboxRow, row: LeaseRow, lease: LeaseView
) -> SettledWarning | None:
    """What became of the warning `shown` (None: it still stands)."""
    assert shown.id is not None
    data = shown.data
    reason = str(data.get("reason"))
    warning = WarningShown(
        shown.id,
        reason,
        shown.created_at,
        time_left_min=float(data.get("time_left_min") or 0.0),
        idle=tuple(str(gpu) for gpu in data.get("idle_gpus") or ()),
    )
    held = [f"{g.node}:{g.index}" for g in lease.gpus]
    outcome = settled(
        warning,
        row.warnings,
        expires_at=row.expires_at,
        held=held,
        snoozed_until=row.snoozed_until,
        now=ctx.now(),
    )
    because = str(data.get("because") or "")
    match outcome:
        case Settled.STANDS:
            return None
        case Settled.EXTENDED:
            by = _extended_by(session, row)
            return SettledWarning(lease, reason, because, outcome, by, row.expires_at)
        case Settled.SNOOZED:
            return SettledWarning(lease, reason, because, outcome, until=row.snoozed_until)
        case Settled.GAVE_BACK:
            given = tuple(gpu for gpu in warning.idle if gpu not in held)
            return SettledWarning(lease, reason, because, outcome, given=given)
    return SettledWarning(lease, reason, because, outcome)


def _extended_by(session: Session, lease: LeaseRow) -> str:
    """Who approved the lease's latest extension ("" when the rules approved it)."""
    assert lease.id is not None
    for request_id in sorted(requests.ids_for_lease(session, lease.id), reverse=True):
        request = requests.get(session, request_id)
        if request is None or request.kind != RequestKind.EXTEND:
            continue
        if request.state != RequestState.APPROVED:
            continue
        by = request.decided_by or ""
        return "" if by in ("", SYSTEM, request.requester) else by
    return ""


def _digest(session: Session, owed: OutboxRow) -> AdminDigest:
    """The digest's lines, after those of the digest it updates in place, if it does: the
    admin's newest message from the bot, unless that took in `DIGEST_UPDATES` sweeps already."""
    lines = [str(line.get("text") or "") for line in owed.data.get("lines") or []]
    latest = outbox.latest_posted(session, owed.recipient, _POSTED)
    rows = (
        outbox.delivered_as(session, OutboxKind.ADMIN_DIGEST, latest.channel, latest.ts)
        if latest is not None
        and latest.kind == OutboxKind.ADMIN_DIGEST
        and latest.id != owed.id
        and latest.channel
        and latest.ts
        else []
    )
    if latest is None or not rows or len(rows) >= DIGEST_UPDATES:
        return AdminDigest(tuple(lines[-DIGEST_SHOWN:]), None, max(0, len(lines) - DIGEST_SHOWN))
    assert latest.channel is not None
    assert latest.ts is not None
    shown = [str(line.get("text") or "") for r in rows for line in r.data.get("lines") or []]
    shown += lines
    earlier = max(0, len(shown) - DIGEST_SHOWN)
    return AdminDigest(tuple(shown[-DIGEST_SHOWN:]), (latest.channel, latest.ts), earlier)


def _stands(owed: OutboxRow, lease: LeaseRow) -> bool:
    """Is `owed` the warning the lease stands on now (not one a newer warning replaced)?"""
    return lease.warnings.warning_outbox(str(owed.data.get("reason"))) == owed.id


def _warning(ctx: Context, owed: OutboxRow, row: LeaseRow, lease: LeaseView) -> LeaseWarning:
    data = owed.data
    timing = ctx.policy.timing
    return LeaseWarning(
        lease,
        str(data["reason"]),
        str(data.get("because") or ""),
        grace=timing.grace,
        now=ctx.now(),
        time_left_min=float(data.get("time_left_min") or 0.0),
        idle_for_min=float(data.get("idle_for_min") or 0.0),
        snoozes_left=max(0, timing.max_snoozes - row.snoozes),
        recall=data.get("recall") if isinstance(data.get("recall"), dict) else None,
        notice=ctx.policy.recall.notice,
        idle=tuple(str(gpu) for gpu in data.get("idle_gpus") or ()),
    )


def _closed(session: Session, owed: OutboxRow, lease: LeaseView) -> LeaseClosed:
    by = str(owed.data.get("by") or "")
    redraws = []
    for shown in outbox.landed(
        session, owed.subject, (OutboxKind.LEASE_GRANTED, OutboxKind.LEASE_WARNING)
    ):
        if not shown.channel or not shown.ts:
            continue
        now: EndedGrant | EndedWarning
        if shown.kind == OutboxKind.LEASE_GRANTED:
            now = EndedGrant(lease, by)
        else:
            reason, because = str(shown.data.get("reason")), str(shown.data.get("because") or "")
            now = EndedWarning(lease, reason, because, by)
        redraws.append(Redraw(shown.channel, shown.ts, now))
    return LeaseClosed(lease, by, tuple(redraws))
