"""Rendering what the outbox owes into Slack messages, from the database as it stands now."""

from __future__ import annotations

from bot.services import Services
from bot.slack.blocks import approval_card, grant_message, settled_card
from bot.slack.blocks.kit import Message, context, escape, mention, message, section
from bot.slack.delivery import Render, Rendered
from bot.slack.people import People
from storage.tables import OutboxRow


def renderer(services: Services, people: People) -> Render:
    def render(row: OutboxRow) -> Rendered | None:
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
        if row.kind == "approval_card":
            if request.state != "pending":  # settled before its card went out
                return settled_card(request, name, because=services.because(request.id))
            quota = services.quota_of(request.team, request.pool)
            if quota is None:
                return None
            ahead = services.queued_ahead(request.pool)
            return approval_card(request, name, quota, ahead, services.because(request.id))
        if row.kind == "card_settled":
            return settled_card(request, name, note=str(data.get("reason") or ""))
        return _decided(
            request.code, str(data["verdict"]), str(data["by"]), str(data["reason"]), request.state
        )
    if row.kind in ("lease_granted", "lease_ended"):
        lease = services.lease(int(data["lease"]))
        if lease is None:
            return None
        if row.kind == "lease_granted":
            return grant_message(lease)
        text = f"{mention(str(data['by']))} ended your lease {lease.code} ({lease.pool})."
        return message(text, [section(text)])
    return None


def _decided(code: str, verdict: str, by: str, reason: str, state: str) -> Message:
    """The requester's DM after a person settled their request (grants bring their own DM)."""
    if verdict == "deny":
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
