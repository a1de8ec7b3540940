"""The sweep: the periodic, level-triggered reconcile pass that warns, reclaims and notifies.

It builds one fact per active lease and per GPU, lets the sweep rules say what to do, then acts
only where the safety invariants allow: nothing is reclaimed without a delivered warning for
that reason and the grace period since its delivery (2); unknown telemetry is never idle (3);
protected leases are never reclaimed (4); a pause turns every action into a recorded "would
have" (5). Each action re-reads its lease under lock and is recorded once, so a second pass
right after the first changes nothing (8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, col, select

from bot.services import admin, notices, sweep_gpus
from bot.services.context import Context, record
from bot.services.leases import end_lease
from bot.services.sweep_facts import (
    GpuSnapshot,
    LeaseSnapshot,
    Readings,
    Warned,
    expiry_stage,
    gpu_facts,
    lease_facts,
)
from bot.services.sweep_gpus import act_on_gpu
from rules.domain import Action, LeaseState, Reason, Subject
from rules.engine import Decision, Match
from storage import outbox
from storage.db import lock_for_update
from storage.outbox import Owed
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, OutboxRow

SWEEPER = "gpubot"
# The warning a reclaim needs, by the reclaim's reason.
_WARNING_FOR = {
    Reason.EXPIRED: "expiry",
    Reason.IDLE: "idle",
    Reason.UNHEALTHY: "unhealthy",
    Reason.PREEMPTED: "preempt",
}


@dataclass
class SweepReport:
    warned: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    notified: list[str] = field(default_factory=list)
    would_have: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)  # reclaims the invariants refused

    @property
    def changed(self) -> bool:
        return bool(self.warned or self.reclaimed or self.notified or self.would_have)


@dataclass
class Pass:
    """One sweep: what it works with and what it did."""

    ctx: Context
    readings: Readings
    now: datetime
    paused: bool
    report: SweepReport = field(default_factory=SweepReport)
    unreserved: set[str] = field(default_factory=set)  # GPUs whose unreserved use was told


def sweep(ctx: Context, readings: Readings) -> SweepReport:
    now = ctx.now()
    with ctx.db.read() as session:
        leases, warned = _leases(session)
        gpus = _gpus(session)
        paused = admin.is_paused(session, ctx)
        told = sweep_gpus.told_keys(session)
    run = Pass(ctx, readings, now, paused, unreserved=told)
    for lease in leases:
        lease_readings = [readings.gpu(node, index, now) for node, index in lease.slots]
        facts = lease_facts(ctx.policy, lease, lease_readings, warned[lease.id], now)
        _act_on_lease(run, lease, ctx.live.decide(Subject.LEASE, facts), warned[lease.id])
    for gpu in gpus:
        facts = gpu_facts(gpu, readings.gpu(gpu.node, gpu.index, now))
        act_on_gpu(run, gpu, ctx.live.decide(Subject.GPU, facts))
    return run.report


# ---- what the database holds ------------------------------------------------------------


def _leases(session: Session) -> tuple[list[LeaseSnapshot], dict[int, Warned]]:
    rows = session.exec(select(LeaseRow).where(LeaseRow.state == LeaseState.ACTIVE)).all()
    slots: dict[int, list[tuple[str, int]]] = {}
    for lease_id, node, index in session.exec(
        select(LeaseGpuRow.lease_id, NodeRow.name, GpuRow.index)
        .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .where(col(LeaseGpuRow.active).is_(True))
    ).all():
        slots.setdefault(lease_id, []).append((node, index))
    outbox_ids = [
        int(w["outbox"])
        for row in rows
        for w in row.warnings.values()
        if isinstance(w, dict) and "outbox" in w
    ]
    delivered = {
        r.id: r.delivered_at
        for r in session.exec(select(OutboxRow).where(col(OutboxRow.id).in_(outbox_ids))).all()
        if r.state == outbox.DELIVERED
    }
    snapshots, warned = [], {}
    for row in rows:
        assert row.id is not None
        snapshots.append(
            LeaseSnapshot(
                row.id,
                row.holder,
                row.team,
                row.pool,
                row.gpus,
                row.priority,
                row.protected,
                row.granted_at,
                row.expires_at,
                dict(row.warnings),
                row.snoozed_until,
                tuple(sorted(slots.get(row.id, []))),
            )
        )
        warned[row.id] = Warned(
            {
                reason: delivered.get(int(w["outbox"]))
                for reason, w in row.warnings.items()
                if isinstance(w, dict) and "outbox" in w
            }
        )
    return snapshots, warned


def _gpus(session: Session) -> list[GpuSnapshot]:
    held = dict(
        session.exec(
            select(LeaseGpuRow.gpu_id, LeaseGpuRow.lease_id).where(
                col(LeaseGpuRow.active).is_(True)
            )
        ).all()
    )
    out = []
    for gpu, node in session.exec(
        select(GpuRow, NodeRow).join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
    ).all():
        assert gpu.id is not None
        out.append(
            GpuSnapshot(
                gpu.id,
                node.name,
                gpu.index,
                gpu.model,
                gpu.pool,
                gpu.state,
                node.drained,
                held.get(gpu.id),
            )
        )
    return out


# ---- acting on a lease ------------------------------------------------------------------


def _act_on_lease(run: Pass, lease: LeaseSnapshot, decision: Decision, warned: Warned) -> None:
    for match in decision.would_have:
        _would_have(run, lease, match, decision, why="observe")
    for match in decision.actions:
        action, reason = match.verdict.action, match.verdict.reason
        assert action is not None
        assert reason is not None
        if run.paused:
            _would_have(run, lease, match, decision, why="paused")
        elif action == Action.WARN:
            _warn(run, lease, reason, decision)
        elif action == Action.RECLAIM:
            refusal = _may_reclaim(run, lease, reason, decision, warned)
            if refusal:
                run.report.held_back.append(f"L{lease.id} {reason}: {refusal}")
            else:
                _reclaim(run, lease, reason, decision)
        else:
            _notice_once(run, lease, f"notice:{reason}", match.because, decision)
    if "idle" in lease.warnings and not decision.facts["lease.idle"]:
        _forget(run, lease, "idle")  # busy again: that idle warning no longer stands
    if "unhealthy" in lease.warnings and not decision.facts["lease.unhealthy"]:
        _forget(run, lease, "unhealthy")


def _may_reclaim(
    run: Pass, lease: LeaseSnapshot, reason: Reason, decision: Decision, warned: Warned
) -> str | None:
    """The invariants, checked in code whatever the rules say; a reason not to, or None."""
    facts = decision.facts
    if facts["lease.protected"]:
        return "protected leases are never reclaimed automatically"
    if reason == Reason.IDLE and not facts["telemetry.fresh"]:
        return "telemetry is not fresh, so idleness is unknown"
    if reason == Reason.EXPIRED and run.now < lease.expires_at:
        return "not expired"
    warning = _WARNING_FOR.get(reason)
    delivered = warned.at(warning) if warning else None
    if delivered is None:
        return f"no delivered {warning} warning yet"
    grace = run.ctx.policy.timing.grace
    if run.now - delivered < grace:
        return f"grace runs until {(delivered + grace).isoformat()}"
    return None


def _locked(session: Session, lease: LeaseSnapshot) -> LeaseRow | None:
    """The lease as it is now, if it is still the one the sweep looked at."""
    stmt = select(LeaseRow).where(LeaseRow.id == lease.id)
    row = session.exec(lock_for_update(session, stmt)).first()
    if row is None or row.state != LeaseState.ACTIVE or row.expires_at != lease.expires_at:
        return None  # released, extended or reclaimed meanwhile: the next pass sees it afresh
    return row


def _warn(run: Pass, lease: LeaseSnapshot, reason: Reason, decision: Decision) -> None:
    key, now = reason.value, run.now
    facts = decision.facts
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None:
            return
        previous = row.warnings.get(key)
        # One warning per reason; expiry warns again only when a nearer lead time is crossed.
        if previous is not None and not (
            reason == Reason.EXPIRY and facts["lease.expiry_warning_due"]
        ):
            return
        stage = expiry_stage(run.ctx.policy, lease, now) if reason == Reason.EXPIRY else None
        data = {
            "lease": lease.id,
            "reason": key,
            "because": _because(decision, reason),
            "time_left_min": facts["lease.time_left"],
            "idle_for_min": facts["lease.idle_for"],
        }
        owed = outbox.owe(
            session, Owed("lease_warning", f"lease:{lease.id}", lease.holder, data), at=now
        )
        sent = {"outbox": owed.id, "owed_at": now.isoformat(), "lead_min": stage or 0.0}
        row.warnings = {**row.warnings, key: sent}
        session.add(row)
        record(
            session,
            at=now,
            actor=SWEEPER,
            tag="lease:warned",
            subject=f"lease:{lease.id}",
            decision=decision,
            outcome=f"warn {key}",
            detail={"reason": key, "outbox": owed.id},
        )
    run.report.warned.append(f"L{lease.id} {key}")


def _because(decision: Decision, reason: Reason) -> str:
    found = (m.because for m in decision.actions if m.verdict.reason == reason)
    return next(found, decision.because)


def _reclaim(run: Pass, lease: LeaseSnapshot, reason: Reason, decision: Decision) -> None:
    now = run.now
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None:
            return
        record(
            session,
            at=now,
            actor=SWEEPER,
            tag="sweep:reclaim",
            subject=f"lease:{lease.id}",
            decision=decision,
            outcome=f"reclaim {reason}",
            detail={"reason": reason.value},
        )
        end_lease(session, row, LeaseState.RECLAIMED, reason.value, actor=SWEEPER, now=now)
        data = {"lease": lease.id, "reason": reason.value, "because": _because(decision, reason)}
        owed = Owed("lease_reclaimed", f"lease:{lease.id}", lease.holder, data)
        outbox.owe(session, owed, at=now)
    run.report.reclaimed.append(f"L{lease.id} {reason}")


def _would_have(
    run: Pass, lease: LeaseSnapshot, match: Match, decision: Decision, *, why: str
) -> None:
    """Record once what an action would have done, and tell the admins (pause or observe)."""
    key = f"would:{match.rule}:{match.verdict}"
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None or key in row.warnings:
            return
        row.warnings = {**row.warnings, key: {"at": run.now.isoformat(), "why": why}}
        session.add(row)
        record(
            session,
            at=run.now,
            actor=SWEEPER,
            tag="sweep:would-have",
            subject=f"lease:{lease.id}",
            decision=decision,
            outcome=f"would {match.verdict}",
            detail={"rule": match.rule, "why": why},
        )
        lead = "Automation is paused: rule" if why == "paused" else "Observe-only rule"
        text = (
            f"{lead} `{match.rule}` would have done `{match.verdict}` to L{lease.id}: "
            f"{match.because}"
        )
        tell_admins(run, session, f"lease:{lease.id}", text)
    run.report.would_have.append(f"L{lease.id} {match.verdict} ({why})")


def _notice_once(run: Pass, lease: LeaseSnapshot, key: str, text: str, decision: Decision) -> None:
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None or key in row.warnings:
            return
        row.warnings = {**row.warnings, key: {"at": run.now.isoformat()}}
        session.add(row)
        record(
            session,
            at=run.now,
            actor=SWEEPER,
            tag="sweep:notified",
            subject=f"lease:{lease.id}",
            decision=decision,
            outcome="notify admins",
            detail={"key": key},
        )
        tell_admins(run, session, f"lease:{lease.id}", f"L{lease.id}: {text}")
    run.report.notified.append(f"L{lease.id} {key}")


def _forget(run: Pass, lease: LeaseSnapshot, key: str) -> None:
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is not None and key in row.warnings:
            row.warnings = {k: v for k, v in row.warnings.items() if k != key}
            session.add(row)


def tell_admins(run: Pass, session: Session, subject: str, text: str) -> None:
    notices.tell_admins(session, run.ctx.policy.admins, subject, text, at=run.now)
