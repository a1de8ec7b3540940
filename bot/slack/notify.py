"""Rendering what the outbox owes into Slack messages, from the database as it stands now.

A reply to a request was rendered when the request was carried out and is sent as it is; a Home
tab is drawn at delivery, so it shows what is true when it is published.
"""

from __future__ import annotations

from bot.services import Services
from bot.slack.blocks import approval_card, grant_message, home_view, settled_card
from bot.slack.blocks.kit import Message, context, escape, mention, message, section
from bot.slack.blocks.leases import ended_grant_message, ended_text
from bot.slack.blocks.warnings import (
    admin_notice,
    ended_warning_message,
    recall_withdrawn_message,
    reclaimed_message,
    unreserved_message,
    warning_message,
)
from bot.slack.people import People
from bot.slack.sending import Render, Rendered
from storage.tables import OutboxRow


def renderer(services: Services, people: People) -> Render:
    def render(row: OutboxRow) -> Rendered | None:
        if row.kind == "reply":
            return Rendered(str(row.data.get("text") or ""), list(row.data.get("blocks") or []))
        if row.kind == "home":
            return Rendered("", [], view=home_view(services.home(row.recipient)))
        if row.kind == "lease_closed":
            return _closed(services, row)
        built = _render(services, people, row)
        return Rendered(built.text, built.blocks) if built is not None else None

    return render


def _render(services: Services, people: People, row: OutboxRow) -> Message | None:
    data = row.data
    if row.kind in ("approval_card", "card_settled", "request_decided"):
        request = services.request(int(data["request"]))
        if request is None:
            return None
        name = people.name(request.requester)
        if row.kind == "approval_card" or (
            row.kind == "card_settled" and request.state == "pending"
        ):
            # A card redrawn while its request still waits shows today's numbers and buttons.
            if request.state != "pending":  # settled before its card went out
                return settled_card(request, name, because=services.because(request.id))
            quota = services.quota_of(request.team, request.pool)
            if quota is None:
                return None
            effects = services.approval_effects(request.id)
            if effects is None:
                return None
            return approval_card(request, name, quota, effects, services.because(request.id))
        if row.kind == "card_settled":
            return settled_card(request, name, note=str(data.get("reason") or ""))
        return _decided(
            request.code, str(data["verdict"]), str(data["by"]), str(data["reason"]), request.state
        )
    if row.kind in (
        "lease_granted",
        "lease_ended",
        "lease_warning",
        "lease_reclaimed",
        "recall_withdrawn",
    ):
        lease = services.lease(int(data["lease"]))
        if lease is None:
            return None
        if row.kind == "lease_granted":
            # Ended before its grant went out: the DM says so rather than offer buttons.
            if lease.state != "active":
                return ended_grant_message(lease)
            return grant_message(lease, [str(u) for u in data.get("unknown", [])])
        if row.kind == "lease_warning":
            if lease.state != "active" or not services.warning_stands(lease.id, row):
                return None  # superseded, or released or extended before it could go out
            timing = services.policy.timing
            return warning_message(
                lease,
                str(data["reason"]),
                str(data.get("because") or ""),
                grace=timing.grace,
                now=services.ctx.now(),
                time_left_min=float(data.get("time_left_min") or 0.0),
                idle_for_min=float(data.get("idle_for_min") or 0.0),
                snoozes_left=max(0, timing.max_snoozes - services.snoozes(lease.id)),
                recall=data.get("recall") if isinstance(data.get("recall"), dict) else None,
                notice=services.policy.recall.notice,
            )
        if row.kind == "recall_withdrawn":
            return recall_withdrawn_message(lease) if lease.state == "active" else None
        if row.kind == "lease_reclaimed":
            return reclaimed_message(lease, str(data["reason"]), str(data.get("because") or ""))
        text = f"{mention(str(data['by']))} ended your lease {lease.code} ({lease.pool})."
        return message(text, [section(text)])
    if row.kind == "unreserved_use":
        return unreserved_message(
            str(data["node"]), int(data["index"]), str(data["pool"]), str(data["user"])
        )
    if row.kind in ("admin_notice", "notice"):
        return admin_notice(str(data["text"]))
    return None


def _closed(services: Services, row: OutboxRow) -> Rendered | None:
    """An ended lease's grant and warning DMs, each redrawn without buttons to say how and
    when it ended; those never delivered need nothing."""
    lease = services.lease(int(row.data["lease"]))
    if lease is None or lease.state == "active":
        return None
    by = str(row.data.get("by") or "")
    updates = []
    for shown in services.landed(row.subject, ("lease_granted", "lease_warning")):
        if not shown.channel or not shown.ts:
            continue
        if shown.kind == "lease_granted":
            now = ended_grant_message(lease, by)
        else:
            reason, because = str(shown.data.get("reason")), str(shown.data.get("because") or "")
            now = ended_warning_message(lease, reason, because, by)
        updates.append((shown.channel, shown.ts, Rendered(now.text, now.blocks)))
    return Rendered(ended_text(lease, by), [], updates=tuple(updates))


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
