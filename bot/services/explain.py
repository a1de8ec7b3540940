"""`why`: the stored explanation of any decision, rebuilt from the audit log alone, its times
in the reader's zone and people as `<@U…>` mentions (the Slack front shows their names)."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta, tzinfo

from sqlmodel import Session

from bot.services import recall
from bot.services.context import Context
from bot.services.results import Explanation, Refused
from rules.domain import format_duration, plural
from rules.policy import show
from storage import audit
from storage import leases as storage_leases
from storage import requests as storage_requests
from storage.audit import AuditTag
from storage.tables import AuditRow, RequestRow

_REF = re.compile(r"^\s*(?:(?P<kind>[RrLlAa#])\s*)?(?P<id>\d{1,9})\s*$", re.ASCII)
# The facts worth showing a person; the audit row keeps them all.
_KEY_FACTS = (
    "request.gpus",
    "request.pool",
    "request.duration",
    "team.used",
    "team.used_after",
    "team.nominal",
    "team.limit",
    "pool.free",
    "pool.lendable",
)


def why(ctx: Context, user: str, ref: str, *, tz: tzinfo = UTC) -> Explanation | Refused:
    """Explain R<n> (a request), L<n> (a lease) or A<n> (one audit row) to those allowed,
    with times in `tz` (the reader's zone)."""
    m = _REF.match(ref)
    if not m:
        return Refused(
            f"`{ref}` is not an id. Use R12 for a request, L7 for a lease, A31 for an audit entry.",
            "bad-ref",
        )
    kind, number = (m.group("kind") or "").upper(), int(m.group("id"))
    if not kind:
        return Refused(
            f"Say which {number} you mean: R{number} (request) or L{number} (lease).", "ambiguous"
        )
    with ctx.db.read() as session:
        if kind == "R":
            found = _request(ctx, session, user, number, tz)
        elif kind == "L":
            found = _lease(ctx, session, user, number, tz)
        else:
            found = _audit_row(ctx, session, user, number, tz)
    if isinstance(found, Refused):
        return found
    return replace(found, title=f"Why {found.subject}")


def audit_trail(ctx: Context, user: str, ref: str, *, tz: tzinfo = UTC) -> Explanation | Refused:
    """Every audit row of a request or lease, with its hash, for those allowed to see it."""
    found = why(ctx, user, ref, tz=tz)
    if isinstance(found, Refused):
        return found
    with ctx.db.read() as session:
        rows: list[AuditRow] = []
        for line in found.lines:
            row = audit.get(session, int(line.split(" ", 1)[0][1:]))
            if row is not None:
                rows.append(row)
    lines = tuple(
        f"A{r.id} {when(r.at, tz, seconds=True)} `{r.tag}` by {_by(r.actor)} "
        f"outcome={r.outcome or '-'} rule={r.deciding_rule or '-'} hash={r.hash[:12]}"
        for r in rows
    )
    title = f"Audit trail of {found.subject}"
    return Explanation(found.subject, title, lines, title=title)


def when(at: datetime, tz: tzinfo, *, seconds: bool = False) -> str:
    """A stored time (naive means UTC) in the reader's zone, with the zone's abbreviation."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return aware.astimezone(tz).strftime(f"%Y-%m-%d %H:%M{':%S' if seconds else ''} %Z")


def _by(actor: str) -> str:
    return "gpubot" if actor == "gpubot" else f"<@{actor}>"


def may_see(ctx: Context, user: str, owner: str, team: str) -> bool:
    """The person concerned, their team's managers and admins."""
    policy = ctx.policy
    managers = policy.teams[team].managers if team in policy.teams else frozenset()
    return user == owner or user in managers or policy.is_admin(user)


def _request(
    ctx: Context, session: Session, user: str, number: int, tz: tzinfo
) -> Explanation | Refused:
    request = storage_requests.get(session, number)
    if request is None:
        return Refused(f"There is no request R{number}.", "no-request")
    if not may_see(ctx, user, request.requester, request.team):
        return Refused(
            f"R{number} is <@{request.requester}>'s; only they, their managers and "
            "admins may see why.",
            "not-allowed",
        )
    length = format_duration(timedelta(seconds=request.duration_s))
    size = f"{plural(request.gpus, request.pool + ' GPU')} for {length}"
    summary = (
        f"R{number}: <@{request.requester}> asked for {size} ({request.kind}); "
        f"it is {request.state}."
    )
    rows = audit.history(session, f"request:{number}")
    if request.lease_id is not None:
        rows += audit.history(session, f"lease:{request.lease_id}")
    rows += _recalls_for(session, request)
    lines = tuple(_lines(sorted(rows, key=_order), tz))
    passed = recall.waiting_guarantee(ctx, session, request)
    return Explanation(
        f"R{number}", summary, lines, passed_over=passed or (), reason=request.reason
    )


def _recalls_for(session: Session, request: RequestRow) -> list[AuditRow]:
    """The recalls made for a request: how the borrowed leases for it were chosen."""
    found = []
    assert request.id is not None
    since = request.created_at
    for lease_id in storage_leases.recalled_for(session, request.pool, request.id, since):
        found += [
            r
            for r in audit.history(session, f"lease:{lease_id}")
            if r.tag in (AuditTag.LEASE_RECALLED, AuditTag.LEASE_RECALL_REASSIGNED)
            and r.detail.get("request") == request.id
        ]
    return found


def _lease(
    ctx: Context, session: Session, user: str, number: int, tz: tzinfo
) -> Explanation | Refused:
    lease = storage_leases.get(session, number)
    if lease is None:
        return Refused(f"There is no lease L{number}.", "no-lease")
    if not may_see(ctx, user, lease.holder, lease.team):
        return Refused(
            f"L{number} is <@{lease.holder}>'s; only they, their managers and admins may see why.",
            "not-allowed",
        )
    gpus = plural(lease.gpus, f"{lease.pool} GPU")
    summary = f"L{number}: {gpus} held by <@{lease.holder}>; it is {lease.state}."
    rows = audit.history(session, f"lease:{number}")
    for request_id in storage_requests.ids_for_lease(session, number):
        rows += audit.history(session, f"request:{request_id}")
    lines = tuple(_lines(sorted(rows, key=_order), tz))
    return Explanation(f"L{number}", summary, lines, reason=lease.reason)


def _audit_row(
    ctx: Context, session: Session, user: str, number: int, tz: tzinfo
) -> Explanation | Refused:
    row = audit.get(session, number)
    if row is None:
        return Refused(f"There is no audit entry A{number}.", "no-audit")
    if not ctx.policy.is_admin(user) and row.actor != user:
        return Refused("Only admins may read audit entries about others.", "not-allowed")
    summary = f"A{number}: {row.tag} on {row.subject}"
    return Explanation(f"A{number}", summary, tuple(_lines([row], tz)))


def _order(row: AuditRow) -> int:
    return row.id or 0


def _lines(rows: list[AuditRow], tz: tzinfo) -> list[str]:
    return [_head(row, tz) + (_decided(row) if row.deciding_rule else _done(row)) for row in rows]


def _head(row: AuditRow, tz: tzinfo) -> str:
    return f"A{row.id} {when(row.at, tz)} `{row.tag}` by {_by(row.actor)}"


def _decided(row: AuditRow) -> str:
    """A decision: its outcome, the rule that decided and why, what else matched, the facts."""
    because = str(row.detail.get("because", "")) if row.detail else ""
    rule = (
        "no rule matched (default)"
        if row.deciding_rule == "default"
        else f"rule `{row.deciding_rule}`"
    )
    text = f": {row.outcome} by {rule}"
    if because:
        text += f", because {because}"
    others = [r for r in row.matching_rules if r != row.deciding_rule]
    if others:
        text += f"; also matched: {', '.join(others)}"
    seen = ", ".join(f"{k}={show(k, row.facts[k])}" for k in _KEY_FACTS if k in row.facts)
    if seen:
        text += f" (saw {seen}; rules {row.revision}, {row.engine})"
    for would in row.detail.get("would_have", []) if row.detail else []:
        text += f"; observe-only rule `{would['rule']}` would have said {would['then']}"
    return text


def _done(row: AuditRow) -> str:
    """A state change: what a recall did, or the reason given."""
    chased = _chased(row)
    if chased:
        return chased
    if row.tag == AuditTag.LEASE_RECALLED:
        return (
            f": recalled for R{row.detail.get('request')} of team "
            f"{row.detail.get('for_team')}, which needs its nominal GPUs back; "
            f"chosen because {row.detail.get('because')}"
        )
    if row.tag == AuditTag.LEASE_RECALL_REASSIGNED:
        return (
            f": the recall stands, now for R{row.detail.get('request')} of team "
            f"{row.detail.get('for_team')}"
        )
    if row.tag == AuditTag.LEASE_RECALL_WITHDRAWN:
        return f": recall withdrawn, as {row.detail.get('why')}"
    if row.tag == AuditTag.LEASE_SHRUNK:
        given = ", ".join(str(gpu) for gpu in row.detail.get("gave_back", []))
        return f": gave back {given}, kept {row.detail.get('kept')} ({row.detail.get('why')})"
    if row.detail.get("reason"):
        return f": {row.detail['reason']}"
    return ""


def _chased(row: AuditRow) -> str:
    """A step of the approval lifecycle (bot.services.approval_lifecycle), or ""."""
    detail = row.detail or {}
    asked = ", ".join(f"<@{who}>" for who in detail.get("asked", []))
    if row.tag in (AuditTag.REQUEST_REMINDED, AuditTag.REQUEST_NUDGED):
        return f": reminded {asked or 'the approvers'}"
    if row.tag == AuditTag.REQUEST_ESCALATED:
        to = ", ".join(f"<#{t}>" if t[:1] in "CG" else f"<@{t}>" for t in detail.get("to", []))
        return f": escalated to {to}"
    if row.tag == AuditTag.REQUEST_EXPIRED:
        return f": withdrawn, as {detail.get('why')}"
    if row.tag == AuditTag.REQUEST_WOULD_HAVE:
        return f": {row.outcome}, but automation was paused"
    if row.tag == AuditTag.REQUEST_STILL_PENDING:
        return f": told the holder it still waits as L{detail.get('lease')} nears its end"
    if row.tag == AuditTag.REQUEST_ASKED_AGAIN:
        return f": asked again as R{detail.get('request')}"
    return ""
