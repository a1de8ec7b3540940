"""Drawing what the outbox owes as Slack messages: a notice read from the database as it stands
now (`Services.notice`), matched to its blocks.

A reply to a request was rendered when the request was carried out and is sent as it is; a Home
tab is drawn at delivery, so it shows what is true when it is published.
"""

from __future__ import annotations

from bot.services import Services
from bot.services.digests import LabDigest, PersonalDigest
from bot.services.notice_views import (
    AdminDigest,
    AdminNotice,
    ApprovalCard,
    ApprovalReminder,
    EndedByOther,
    EndedGrant,
    EndedWarning,
    ExtensionWaiting,
    Grant,
    LeaseClosed,
    LeaseRedrawn,
    LeaseWarning,
    Notice,
    RecallWithdrawn,
    Reclaimed,
    RequestDecided,
    SettledCard,
    SettledWarning,
    UnreservedUse,
)
from bot.services.results import RequestView
from bot.slack.blocks import approval_card, grant_message, home_view, settled_card
from bot.slack.blocks.approval import (
    approval_reminder,
    denied_message,
    escalated_line,
    extension_waiting,
)
from bot.slack.blocks.digests import lab_digest, personal_digest
from bot.slack.blocks.kit import (
    Message,
    ask_again_button,
    context,
    escape,
    mention,
    message,
    section,
)
from bot.slack.blocks.leases import ended_grant_message, ended_text
from bot.slack.blocks.warnings import (
    admin_digest,
    admin_notice,
    ended_warning_message,
    recall_withdrawn_message,
    reclaimed_message,
    settled_warning_message,
    unreserved_message,
    warning_message,
)
from bot.slack.files import report_file
from bot.slack.people import People
from bot.slack.sending import Render, Rendered
from storage.outbox import OutboxKind
from storage.tables import OutboxRow


def renderer(services: Services, people: People) -> Render:
    def render(row: OutboxRow) -> Rendered | None:
        if row.kind == OutboxKind.REPLY:
            return Rendered(str(row.data.get("text") or ""), list(row.data.get("blocks") or []))
        if row.kind == OutboxKind.HOME:
            return Rendered("", [], view=home_view(services.home(row.recipient)))
        if row.kind == OutboxKind.REPORT_FILE:
            return report_file(services, people, row)
        if row.kind == OutboxKind.DIGEST:
            return _digest(services.digest(row))
        assert row.id is not None
        found = services.notice(row.id)
        return drawn(found, people) if found is not None else None

    return render


def _digest(digest: LabDigest | PersonalDigest | None) -> Rendered | None:
    match digest:
        case LabDigest():
            return _rendered(lab_digest(digest))
        case PersonalDigest():
            return _rendered(personal_digest(digest))
        case _:
            return None


def drawn(notice: Notice, people: People) -> Rendered:
    """The Slack message (or the redraws) a notice is."""
    match notice:
        case LeaseClosed(lease=lease, by=by, redraws=redraws):
            updates = tuple(
                (r.channel, r.ts, _rendered(_drawn_message(r.shows, people))) for r in redraws
            )
            return Rendered(ended_text(lease, by), [], updates=updates)
        case LeaseRedrawn(lease=lease, redraws=redraws):
            updates = tuple(
                (r.channel, r.ts, _rendered(_drawn_message(r.shows, people))) for r in redraws
            )
            note = {"drawn": dict(notice.drawn)} if notice.drawn else None
            return Rendered(f"{lease.code} redrawn", [], updates=updates, note=note)
        case AdminDigest(lines=lines, replaces=replaces, earlier=earlier):
            drawn = _rendered(admin_digest(lines, earlier))
            if replaces is None:
                return drawn
            return Rendered(drawn.text, drawn.blocks, updates=((*replaces, drawn),))
        case ApprovalReminder(request=request, thread_ts=thread_ts):
            name = people.name(request.requester)
            built = approval_reminder(
                request,
                name,
                notice.asked,
                notice.waited,
                in_thread=thread_ts is not None,
                by=notice.by,
            )
            return Rendered(built.text, built.blocks, thread_ts=thread_ts)
        case ExtensionWaiting(request=request, asked=asked, lease_ends_at=ends_at):
            return _rendered(extension_waiting(request, asked, ends_at))
        case _:
            return _rendered(_drawn_message(notice, people))


def _rendered(built: Message) -> Rendered:
    return Rendered(built.text, built.blocks)


def _drawn_message(
    notice: ApprovalCard
    | SettledCard
    | RequestDecided
    | Grant
    | EndedGrant
    | LeaseWarning
    | EndedWarning
    | SettledWarning
    | Reclaimed
    | RecallWithdrawn
    | EndedByOther
    | UnreservedUse
    | AdminNotice,
    people: People,
) -> Message:
    match notice:
        case SettledWarning(lease=lease, reason=reason, outcome=outcome, by=by):
            return settled_warning_message(
                lease,
                reason,
                outcome,
                by=people.label(by) if by else "",
                until=notice.until,
                given=notice.given,
            )
        case ApprovalCard(request=request, quota=quota, effects=effects, because=because):
            escalated = (
                escalated_line(notice.escalated_to, notice.escalated_after)
                if notice.escalated_after is not None
                else ""
            )
            name = people.name(request.requester)
            return approval_card(request, name, quota, effects, because, escalated=escalated)
        case SettledCard(request=request, because=because, note=note):
            name = people.name(request.requester)
            decider = people.label(request.decided_by)
            return settled_card(
                request,
                name,
                because=because,
                note=note,
                by_bot=notice.by_bot,
                decider_name=decider,
            )
        case RequestDecided(verdict="expired"):
            return _expired(notice)
        case RequestDecided(verdict="deny", request=RequestView() as request) as decided:
            return denied_message(request, people.label(decided.by), decided.reason)
        case RequestDecided(code=code, verdict=verdict, by=by, reason=reason, state=state):
            return _decided(code, verdict, people.label(by), reason, state)
        case UnreservedUse(node=node, index=index, pool=pool, user=user):
            return unreserved_message(node, index, pool, user)
        case AdminNotice(text=text):
            return admin_notice(text)
        case _:
            return _lease_message(notice)


def _lease_message(
    notice: Grant
    | EndedGrant
    | LeaseWarning
    | EndedWarning
    | Reclaimed
    | RecallWithdrawn
    | EndedByOther,
) -> Message:
    match notice:
        case Grant(lease=lease, unknown=unknown, warned=warned):
            return grant_message(lease, list(unknown), list(warned))
        case EndedGrant(lease=lease, by=by):
            return ended_grant_message(lease, by)
        case LeaseWarning() as w:
            return warning_message(
                w.lease,
                w.reason,
                w.because,
                grace=w.grace,
                now=w.now,
                time_left_min=w.time_left_min,
                idle_for_min=w.idle_for_min,
                snoozes_left=w.snoozes_left,
                recall=w.recall,
                notice=w.notice,
                idle=w.idle,
            )
        case EndedWarning(lease=lease, reason=reason, because=because, by=by):
            return ended_warning_message(lease, reason, because, by)
        case RecallWithdrawn(lease=lease):
            return recall_withdrawn_message(lease)
        case Reclaimed(lease=lease, reason=reason, because=because, within_team=within_team):
            return reclaimed_message(lease, reason, because, within_team=within_team)
        case EndedByOther(lease=lease, by=by):
            text = f"{mention(by)} ended your lease {lease.code} ({lease.pool})."
            return message(text, [section(text)])


def _decided(code: str, verdict: str, by: str, reason: str, state: str) -> Message:
    """The requester's DM after a person settled their request (grants bring their own DM)."""
    if verdict == "timeout":
        text = f"{code} was withdrawn from the queue; `/gpu borrow` asks again."
    elif verdict == "withdrawn":
        text = f"{code} was withdrawn: {escape(reason)}." if reason else f"{code} was withdrawn."
        reason = ""  # said already
    elif verdict == "deny":
        text = f"{mention(by)} denied {code}."
    elif state == "queued":
        text = f"{mention(by)} approved {code}; it waits in the queue for free GPUs."
    else:
        text = f"{mention(by)} approved {code}."
    blocks = [section(text)]
    if reason:
        blocks.append(context(f"Reason: {escape(reason)}"))
    blocks.append(context(f"`/gpu why {code}` shows the whole story."))
    return message(text, blocks)


def _expired(notice: RequestDecided) -> Message:
    """The requester's DM when nobody decided in time: what happened, and *Ask again*."""
    code = notice.code
    text = f"{code} was withdrawn. {escape(notice.reason)}."
    if notice.kind == "extend":
        blocks = [section(text), context("`/gpu extend` asks again while the lease runs.")]
        return message(text, blocks)
    blocks = [
        section(text),
        context("*Ask again* files the same request once more."),
        ask_again_button(notice.request_id),
    ]
    return message(text, blocks)
