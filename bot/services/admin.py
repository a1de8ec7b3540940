"""Admin switches: the automation kill switch and node drains, audited like everything else."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlmodel import Session

from bot.services import device_records, enforcement, notices
from bot.services.context import SYSTEM, Context, record
from bot.services.results import Refused
from rules.recall import Victim
from storage import audit, keyvalue, leases, nodes
from storage.audit import AuditTag
from storage.tables import LeaseRow


def is_paused(session: Session, ctx: Context) -> bool:
    """Paused by an admin in Slack, or by `automation: paused` in the rule files."""
    return ctx.policy.automation_paused or keyvalue.paused(session)


def would_have(
    session: Session,
    ctx: Context,
    *,
    tag: AuditTag,
    subject: str,
    outcome: str,
    text: str,
    at: datetime,
) -> bool:
    """Record once per pause what a paused automatic action would have done to `subject`
    (`outcome` reads "would <verb>"), and tell the admins `text`; False when recorded already."""
    since = None if ctx.policy.automation_paused else keyvalue.paused_since(session)
    if audit.recorded_since(session, tag, subject, outcome, since):
        return False
    detail = {"why": "paused", "text": text}
    record(session, at=at, actor=SYSTEM, tag=tag, subject=subject, outcome=outcome, detail=detail)
    notices.tell_admins(session, ctx.policy.admins, subject, f"Automation is paused: {text}", at=at)
    return True


def would_recall(session: Session, ctx: Context, victims: Iterable[Victim], at: datetime) -> None:
    """The recalls a paused pass would have started, each recorded once per pause."""
    for victim in victims:
        text = (
            f"L{victim.lease} of <@{victim.holder}> would have been recalled for "
            f"R{victim.request} ({victim.for_team}): {victim.because}"
        )
        subject = f"lease:{victim.lease}"
        tag = AuditTag.RECALL_WOULD_HAVE
        would_have(session, ctx, tag=tag, subject=subject, outcome="would recall", text=text, at=at)


def set_paused(ctx: Context, user: str, paused: bool) -> str | Refused:
    """Pause or resume automation from Slack; a switch already in that position is said so
    and changes nothing."""
    if not ctx.policy.is_admin(user):
        return Refused("Only admins may pause or resume automation.", "not-admin")
    now = ctx.now()
    with ctx.db.write() as session:
        if keyvalue.paused(session) == paused:
            return _already(ctx, paused)
        value = keyvalue.set_paused(session, paused, at=now, by=user)
        tag = AuditTag.AUTOMATION_PAUSED if paused else AuditTag.AUTOMATION_RESUMED
        record(session, at=now, actor=user, tag=tag, subject="automation", outcome=value)
        if not paused and ctx.policy.automation_paused:
            return "Resumed here, but the rule files still say `automation: paused`."
    return (
        "Automation is paused: every automatic action is recorded as “would have” instead."
        if paused
        else "Automation resumed."
    )


def _already(ctx: Context, paused: bool) -> str:
    if paused:
        return "Automation is already paused."
    if ctx.policy.automation_paused:
        return (
            "Automation is paused by the rule files (`automation: paused`), not from Slack: "
            "change the rule files to resume it."
        )
    return "Automation is already running."


def set_drained(
    ctx: Context, user: str, node_name: str, drained: bool, reason: str = ""
) -> str | Refused:
    """A drained node's GPUs leave the pool for new leases; running leases keep them. Who and
    why go to the audit log and the node's history."""
    if not ctx.policy.is_admin(user):
        return Refused("Only admins may drain or undrain nodes.", "not-admin")
    now = ctx.now()
    with ctx.db.write() as session:
        node = nodes.named(session, node_name)
        if node is None:
            names = ", ".join(sorted(n for p in ctx.policy.pools.values() for n in p.nodes))
            return Refused(f"There is no node `{node_name}`. Nodes: {names}.", "no-node")
        faulty = nodes.unhealthy_gpus(session, node.id)
        if node.drained == drained and (drained or not faulty):
            return f"`{node_name}` is already {'drained' if drained else 'in service'}."
        node.drained = drained
        session.add(node)
        if not drained:  # an undrain also returns GPUs taken out by hand or as unhealthy
            for gpu in nodes.gpus_of(session, node.id):
                if gpu.state in ("drained", "unhealthy"):
                    if gpu.state == "unhealthy":
                        device_records.event(
                            session, now, node_name, gpu.index, "recovered", actor=user
                        )
                    gpu.state = "ok"
                    session.add(gpu)
        tag = AuditTag.NODE_DRAINED if drained else AuditTag.NODE_UNDRAINED
        detail = {"reason": reason} if reason else {}
        record(session, at=now, actor=user, tag=tag, subject=f"node:{node_name}", detail=detail)
        kind = "drained" if drained else "undrained"
        device_records.event(session, now, node_name, None, kind, actor=user, **detail)
        if not drained:
            return f"`{node_name}` is back in service."
        enforcement.order_drain(session, ctx, node_name, user, reason)  # slurm, kubernetes
        affected = _leases_on(session, node.id)
        for lease in affected:
            notices.tell(
                session,
                lease.holder,
                f"lease:{lease.id}",
                drained_text(user, node_name, reason, int(lease.id or 0)),
                at=now,
            )
    return drain_reply(node_name, [(int(lease.id or 0), lease.holder) for lease in affected])


def _leases_on(session: Session, node_id: int | None) -> list[LeaseRow]:
    """The active leases holding a GPU of the node, oldest first."""
    held = leases.held_gpus(session)
    ids = sorted({held[g.id][0] for g in nodes.gpus_of(session, node_id) if g.id in held})
    found = (leases.get(session, lease_id) for lease_id in ids)
    return [lease for lease in found if lease is not None]


def drained_text(admin: str, node: str, reason: str, lease_id: int) -> str:
    """What the holder of a lease on a drained node is told: nothing is taken, nothing new
    comes from that node."""
    because = f" ({reason})" if reason else ""
    return (
        f"<@{admin}> drained `{node}`{because}, where L{lease_id} runs. Your lease keeps "
        f"its GPUs there until it ends or you release it; nothing is taken from you. No new "
        f"lease gets GPUs on `{node}` until it is back in service."
    )


def drain_reply(node: str, held: list[tuple[int, str]]) -> str:
    """The admin's answer: the node is out for new leases, and whose leases run on it."""
    if not held:
        return f"`{node}` is drained. No lease runs on it."
    named = ", ".join(f"L{lease_id} of <@{holder}>" for lease_id, holder in held)
    return (
        f"`{node}` is drained: no new lease gets its GPUs. The leases on it keep them until "
        f"they end: {named}. Each holder was told by DM."
    )
