"""The sweep's GPU half: faulty GPUs leave the pool, unreserved use is reported once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.services import device_records, notices
from bot.services.context import Context, record
from bot.services.sweep_pass import Pass
from rules.decision import Decision, Match
from rules.domain import Reason
from rules.lease_facts import GpuSnapshot
from storage import gpus, keyvalue, outbox
from storage import leases as storage_leases
from storage.audit import AuditTag
from storage.outbox import OutboxKind, Owed

SWEEPER = "gpubot"


def act_on_gpu(run: Pass, gpu: GpuSnapshot, decision: Decision) -> None:
    for match in decision.actions:  # each recorded with the rule that asked for it
        if match.verdict.reason == Reason.UNHEALTHY:
            _unhealthy(run, gpu, match, decision.for_action(match))
        elif match.verdict.reason == Reason.UNRESERVED:
            reading = run.reading(gpu.node, gpu.index)
            processes = reading.processes if reading is not None else []
            users = sorted({str(getattr(p, "user", "") or "") for p in processes} - {""})
            _unreserved(run, gpu, users, match, decision.for_action(match))
    settle_unreserved(run, gpu.node, gpu.index, decision.facts)


def settle_unreserved(run: Pass, node: str, index: int, facts: Mapping[str, Any]) -> None:
    """A GPU told of as in unreserved use and no longer in such use: its episode is over (the
    next one tells its users again). Called for every GPU, whatever the rules decided."""
    if run.unreserved and not facts["gpu.unreserved"]:  # most passes: none told
        key = keyvalue.unreserved_key(node, index)
        if key in run.unreserved:
            _clear(run.ctx, key)


def _unhealthy(run: Pass, gpu: GpuSnapshot, match: Match, decision: Decision) -> None:
    """The GPU leaves the pool until an admin undrains its node; admins hear once."""
    if gpu.state == "unhealthy":
        return  # out of service already when this pass began
    with run.ctx.db.write() as session:
        row = gpus.lock(session, gpu.id)
        if row.state == "unhealthy":
            return
        row.state = "unhealthy"
        session.add(row)
        device_records.event(
            session,
            run.now,
            gpu.node,
            gpu.index,
            "fault",
            actor=SWEEPER,
            health=str(decision.facts.get("gpu.health", "")),
            because=match.because,
        )
        subject = f"gpu:{gpu.node}:{gpu.index}"
        record(
            session,
            at=run.now,
            actor=SWEEPER,
            tag=AuditTag.GPU_UNHEALTHY,
            subject=subject,
            decision=decision,
            outcome="out of service",
        )
        notices.tell_admins(
            session,
            run.ctx.policy.admins,
            subject,
            f"{gpu.node} GPU {gpu.index} is out of service: {match.because}. "
            f"`/gpu admin undrain {gpu.node}` returns it once repaired.",
            at=run.now,
            now=run.ctx.now(),
        )
    run.report.notified.append(f"{gpu.node}:{gpu.index} unhealthy")


def _unreserved(
    run: Pass, gpu: GpuSnapshot, users: list[str], match: Match, decision: Decision
) -> None:
    """Tell each Unix user we can map to Slack once per episode, and the admins."""
    key = keyvalue.unreserved_key(gpu.node, gpu.index)
    told_before = run.unreserved.get(key)
    if told_before is not None and all(u in told_before for u in users):
        return  # everyone was told before this pass began
    with run.ctx.db.write() as session:
        told_so_far = keyvalue.users_told(session, key)
        told = set(told_so_far or ())
        new = [u for u in users if u not in told]
        if told_so_far is not None and not new:
            return
        subject = f"gpu:{gpu.node}:{gpu.index}"
        # Whose lease on this GPU was just reclaimed: the reclaim DM told them; inviting
        # them to borrow it back a minute later would undo the reclaim.
        reclaimed = storage_leases.reclaimed_from(
            session, gpu.id, run.now - run.ctx.policy.timing.grace
        )
        # Whose running lease gave this GPU back: the shrink reply told them; likewise.
        shrunk = storage_leases.gave_back(session, gpu.id)
        not_offered, gave_back = [], []
        for unix_user in new:
            slack_user = run.ctx.policy.accounts.get(unix_user)
            if slack_user in shrunk:
                gave_back.append(unix_user)
            elif slack_user in reclaimed:
                not_offered.append(unix_user)
            elif slack_user:
                data = {"node": gpu.node, "index": gpu.index, "pool": gpu.pool, "user": unix_user}
                outbox.owe(
                    session, Owed(OutboxKind.UNRESERVED_USE, subject, slack_user, data), at=run.now
                )
        who = ", ".join(users) or "a user we cannot name"
        text = f"{match.because} (Unix users: {who})."
        if not_offered:
            text += (
                f" Not offered a lease: {', '.join(not_offered)}, whose lease on it was "
                "just reclaimed."
            )
        if gave_back:
            text += f" Not offered a lease: {', '.join(gave_back)}, whose lease gave it back."
        notices.tell_admins(
            session, run.ctx.policy.admins, subject, text, at=run.now, now=run.ctx.now()
        )
        keyvalue.set_users_told(session, key, told | set(new), at=run.now, by=SWEEPER, empty="?")
        record(
            session,
            at=run.now,
            actor=SWEEPER,
            tag=AuditTag.GPU_UNRESERVED,
            subject=subject,
            decision=decision,
            outcome="notify",
            detail={"users": users},
        )
    run.report.notified.append(f"{gpu.node}:{gpu.index} unreserved")


def _clear(ctx: Context, key: str) -> None:
    with ctx.db.read() as session:
        if keyvalue.users_told(session, key) is None:
            return
    with ctx.db.write() as session:
        keyvalue.forget(session, key)
