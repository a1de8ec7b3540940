"""The sweep: the periodic, level-triggered reconcile pass that warns, reclaims and notifies
(and, where a rule says `shrink idle`, gives back a lease's idle GPUs).

It builds one fact per active lease and per GPU, lets the sweep rules say what to do, lets
`rules.reclaim` turn that into the steps the safety invariants allow, and takes them: nothing
is reclaimed without a delivered warning for that reason and the grace period since its
delivery (2); unknown telemetry is never idle (3); protected leases are never reclaimed (4); a
pause turns every action into a recorded "would have" (5). Each action re-reads its lease
under lock and is recorded once, so a second pass right after the first changes nothing (8).

At 10,000 GPUs a pass must stay well under a second: the snapshot is a few set-based reads of
plain columns, each GPU's reading is taken once, and an action whose effect the snapshot already
shows (a warning sent, a notice given) returns without opening a transaction.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlmodel import Session

from bot import foreground, memory
from bot.services import admin, approval_lifecycle, enforcement, notices, recall
from bot.services.context import Context, record
from bot.services.leases import end_lease
from bot.services.shrinking import shrink_in
from bot.services.sweep_gpus import act_on_gpu, settle_unreserved
from bot.services.sweep_pass import UNREAD, Pass, SweepReport
from rules.decision import Decision, Match
from rules.domain import LeaseState, Reason, Subject
from rules.lease_facts import (
    GpuLine,
    GpuSnapshot,
    LeaseSnapshot,
    Readings,
    Warned,
    expiry_stage,
    gpu_idleness,
    gpu_line_facts,
    lease_facts,
)
from rules.marks import PARTLY_IDLE, notice_key, would_have_key
from rules.memo import Matched, PassDecisions
from rules.reclaim import Do, forget_steps, lease_steps, to_shrink
from rules.shrinking import Problem, to_give_back
from storage import keyvalue, leases, outbox
from storage.audit import AuditTag
from storage.outbox import OutboxKind, Owed
from storage.requests import pools_with_queue
from storage.sweep_reads import chunked, gpu_lines
from storage.tables import LeaseRow

SWEEPER = "gpubot"
# Subjects decided between two give_way()s: a few milliseconds of a pass, so an agent's push
# that arrives meanwhile waits about that long for the interpreter (bot.foreground). A subject
# acted on (a transaction or more) gives way before it too: 200 actions take seconds.
_CHUNK = 200


def sweep(ctx: Context, readings: Readings) -> SweepReport:
    # A pass allocates a few objects per GPU and lease and frees them as it goes: the garbage
    # collector's full walks find nothing there, and at 100,000 GPUs they cost a third of the
    # pass. Pushes that agents wait on go first: the pass gives way to them between chunks.
    with memory.full_walks_paused(), foreground.in_background():
        return _sweep(ctx, readings)


def _sweep(ctx: Context, readings: Readings) -> SweepReport:
    now = ctx.now()
    # One snapshot: a lease granted or ended between the GPU lines and the leases' read would
    # otherwise be seen without the GPUs it holds.
    # Read in chunks of rows, between which the pushes being served go first (unless they
    # could not reach the database meanwhile).
    between = None if ctx.db.holds_others_off() else foreground.give_way
    with ctx.db.read(snapshot=True) as session:
        gpus = gpu_lines(session, between)
        # The leases' GPUs are those the GPU lines name as held: read once, not twice.
        active, warned = leases.active_snapshots(session, gpus, between)
        paused = admin.is_paused(session, ctx)
        told = keyvalue.told_unreserved(session)
        waiting = pools_with_queue(session)
    run = Pass(ctx, readings, now, paused, unreserved=told)
    # Subjects whose conditions read the same values share one evaluation (rules.memo).
    decisions = PassDecisions(ctx.live.current)
    # A subject no rule matched has no decision to act on (most of them).
    policy, acted_on, of_slots = ctx.policy, decisions.acted_on, run.of_slots
    give_way = foreground.give_way

    def act(on: list[LeaseSnapshot], warned: dict[int, Warned]) -> None:
        for lease in chunked(on, give_way, _CHUNK):
            lease_readings = of_slots(lease.slots)
            sent = warned[lease.id]
            facts = lease_facts(policy, lease, lease_readings, sent, now)
            decision = acted_on(Subject.LEASE, facts)
            marked = lease.warnings.raw  # unmarked (most leases): nothing to forget or narrow
            if decision is not None or marked:
                give_way()  # what follows may write: the pushes being served go first
            if decision is not None:
                _act_on_lease(run, lease, decision, sent)
            elif marked:  # all lease_steps gives a lease no rule matched
                for step in forget_steps(lease, facts):
                    _forget(run, lease, step.why)
            if marked:  # no partly-idle warning stands on an unmarked lease
                _narrow_idle(run, lease)

    act(active, warned)
    _act_on_gpus(run, gpus, told, decisions)
    # Recalls last, once this pass's reclaims freed what they free, in every pool where
    # requests wait or a recall is under way; the leases recalled now are warned at once.
    recalled = recall.reconcile(ctx, waiting | {s.pool for s in active if s.warnings.recalled})
    run.report.recalled, run.report.recall_withdrawn = recalled.started, recalled.withdrawn
    if recalled.started:
        with ctx.db.read() as session:
            fresh, warned = leases.active_snapshots(session, between=between)
        act([s for s in fresh if f"L{s.id}" in recalled.started], warned)
    run.report.chased = approval_lifecycle.chase(ctx).steps()
    run.report.decided, run.report.evaluated = decisions.answered + decisions.asked, decisions.asked
    decisions.close()
    return run.report


def _act_on_gpus(
    run: Pass,
    gpus: list[GpuLine],
    told: Mapping[str, frozenset[str]],
    decisions: PassDecisions,
) -> None:
    """Decide every GPU, act on those a rule matched, and settle the unreserved use told of.

    A GPU out of service when the pass began, that no rule finds in unreserved use, has
    nothing left to act on whatever rules match it (`act_on_gpu`): no Decision is made of it
    (every faulty GPU, every pass)."""
    matched, decision = decisions.matched, decisions.decision
    # The GPUs told of as in unreserved use, by id: settled below once no longer in such use.
    key = keyvalue.unreserved_key
    told_ids = {line[0] for line in gpus if key(line[1], line[2]) in told} if told else set()
    reading, read = run.reading, run.every_reading().get
    give_way = foreground.give_way
    # Plain tuples: a snapshot is made of a GPU acted on.
    for line in chunked(gpus, give_way, _CHUNK):
        found = read((line[1], line[2]), UNREAD)
        if found is UNREAD:  # not in the telemetry's read of every GPU: read on its own
            found = reading(line[1], line[2])
        facts = gpu_line_facts(line, found)  # type: ignore[arg-type]  # UNREAD replaced
        rules = matched(Subject.GPU, facts)
        if rules is not None and (line[5] != "unhealthy" or _unreserved_use(rules)):
            give_way()  # an action writes: the pushes being served go first
            act_on_gpu(run, GpuSnapshot(*line), decision(Subject.GPU, facts, rules))
        elif line[0] in told_ids:
            give_way()
            settle_unreserved(run, line[1], line[2], facts)


def _unreserved_use(matched: Matched) -> bool:
    """Does a rule matched ask to act on a GPU's unreserved use?"""
    policy, _, found = matched
    rules = policy.rules_for(Subject.GPU)
    return any(rules[i].verdict.reason == Reason.UNRESERVED for i in found)


# ---- acting on a lease ------------------------------------------------------------------


def _act_on_lease(run: Pass, lease: LeaseSnapshot, decision: Decision, warned: Warned) -> None:
    """Carry out what the rules and the invariants decided (`rules.reclaim.lease_steps`).

    Each action is recorded as its own decision: the rule that asked for it, its reason."""
    policy = run.ctx.policy
    for step in lease_steps(lease, decision, warned, policy, run.now, paused=run.paused):
        own = decision.for_action(step.match) if step.match is not None else decision
        if step.do == Do.WOULD_HAVE:
            assert step.match is not None
            _would_have(run, lease, step.match, own, why=step.why)
        elif step.do == Do.WARN:
            _warn(run, lease, step.reason, own)
        elif step.do == Do.RECLAIM:
            _reclaim(run, lease, step.reason, own)
        elif step.do == Do.SHRINK:
            _shrink(run, lease, own)
        elif step.do == Do.HOLD_BACK:
            run.report.held_back.append(f"L{lease.id} {step.reason}: {step.why}")
        elif step.do == Do.NOTIFY:
            assert step.match is not None
            _notice_once(run, lease, notice_key(step.reason), step.match.because, own)
        else:
            _forget(run, lease, step.why)


def _locked(session: Session, lease: LeaseSnapshot) -> LeaseRow | None:
    """The lease as it is now, if it is still the one the sweep looked at (else the next pass
    sees it afresh)."""
    return leases.lock_active(session, lease.id, lease.expires_at)


def _warn(run: Pass, lease: LeaseSnapshot, reason: Reason, decision: Decision) -> None:
    key, now = reason.value, run.now
    facts = decision.facts
    # One warning per reason; expiry warns again only when a nearer lead time is crossed.
    again = reason == Reason.EXPIRY and facts["lease.expiry_warning_due"]
    if lease.warnings.warned(key) and not again:
        return  # already warned when this pass began: no transaction needed to see that
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None:
            return
        if row.warnings.warned(key) and not again:
            return
        if reason == Reason.PREEMPT and not row.warnings.recalled:
            return  # withdrawn since the pass began
        stage = expiry_stage(run.ctx.policy, lease, now) if reason == Reason.EXPIRY else None
        data = {
            "lease": lease.id,
            "reason": key,
            "because": decision.because,
            "time_left_min": facts["lease.time_left"],
            "idle_for_min": facts["lease.idle_for"],
        }
        if reason == Reason.PREEMPT:
            data["recall"] = row.warnings.recall
        idle = _idle_named(run, lease) if reason == Reason.PARTLY_IDLE else ()
        if idle:
            data["idle_gpus"] = [f"{node}:{index}" for node, index in idle]
            data["idle_for_min"] = facts["lease.idle_gpus_for"]
        owed = notices.warned(session, row, data, at=now)
        row.warnings = row.warnings.with_warning(
            key, outbox=owed, owed_at=now, lead_min=stage or 0.0
        )
        if idle:
            row.warnings = row.warnings.with_idle_slots(idle)
        session.add(row)
        record(
            session,
            at=now,
            actor=SWEEPER,
            tag=AuditTag.LEASE_WARNED,
            subject=f"lease:{lease.id}",
            decision=decision,
            outcome=f"warn {key}",
            detail={"reason": key, "outbox": owed},
        )
    run.report.warned.append(f"L{lease.id} {key}")


def _reclaim(run: Pass, lease: LeaseSnapshot, reason: Reason, decision: Decision) -> None:
    now = run.now
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None:
            return
        if reason == Reason.PREEMPTED and not row.warnings.recalled:
            return  # withdrawn since the pass began
        record(
            session,
            at=now,
            actor=SWEEPER,
            tag=AuditTag.SWEEP_RECLAIM,
            subject=f"lease:{lease.id}",
            decision=decision,
            outcome=f"reclaim {reason}",
            detail={"reason": reason.value},
        )
        data: dict[str, object] = {
            "lease": lease.id,
            "reason": reason.value,
            "because": decision.because,
        }
        if reason == Reason.PREEMPTED and row.warnings.recalled_within_team:
            # The sweep rule speaks of lenders; the recall's own reason names the request.
            data["within_team"] = True
            data["because"] = str((row.warnings.recall or {}).get("because") or decision.because)
        end_lease(session, row, LeaseState.RECLAIMED, reason.value, actor=SWEEPER, now=now)
        owed = Owed(OutboxKind.LEASE_RECLAIMED, f"lease:{lease.id}", lease.holder, data)
        outbox.owe(session, owed, at=now)
        if run.ctx.enforcer != "notify":  # the order stands or falls with the reclaim
            enforcement.order(session, run.ctx, lease, run.reading, now)
    run.report.reclaimed.append(f"L{lease.id} {reason}")


def _idle_named(run: Pass, lease: LeaseSnapshot) -> tuple[tuple[str, int], ...]:
    """The GPUs of the lease idle for the idle threshold, as this pass reads them."""
    readings = [run.reading(node, index) for node, index in lease.slots]
    return gpu_idleness(run.ctx.policy, lease, readings, run.now).idle


def _narrow_idle(run: Pass, lease: LeaseSnapshot) -> None:
    """A GPU the partly-idle warning named is no longer idle (busy again, or unknown): its
    Give back button no longer offers it, and once none it named is idle the warning no longer
    stands, so GPUs idle since are warned of anew before a shrink may take them. Nothing is
    written while the named GPUs stay idle."""
    named = lease.warnings.idle_slots()
    if not named:
        return
    idle = set(_idle_named(run, lease))
    still = tuple(slot for slot in named if slot in idle)
    if len(still) == len(named):
        return
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is not None and row.warnings.idle_slots() == named:
            marks = row.warnings
            row.warnings = marks.with_idle_slots(still) if still else marks.without(PARTLY_IDLE)
            session.add(row)


def _shrink(run: Pass, lease: LeaseSnapshot, decision: Decision) -> None:
    """`shrink idle`: give back the GPUs idle now that the delivered partly-idle warning named,
    keep the rest (`rules.reclaim.may_shrink` allowed it on this pass's facts)."""
    idle = _idle_named(run, lease)
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None:
            return
        held = leases.slots_of(session, lease.id)
        named = to_shrink(row.warnings.idle_slots(), idle, held)
        if not named:
            run.report.held_back.append(f"L{lease.id} idle: no GPU the warning named is idle")
            return
        chosen = to_give_back(f"L{lease.id}", held, named=named)
        if isinstance(chosen, Problem):
            return  # every GPU idle now: that is a reclaim's business, not a shrink's
        shrink_in(
            session, run.ctx, row, chosen, actor=SWEEPER, why="idle", now=run.now, decision=decision
        )
    run.report.shrunk.append(f"L{lease.id} gave back {len(chosen)}")


def _would_have(
    run: Pass, lease: LeaseSnapshot, match: Match, decision: Decision, *, why: str
) -> None:
    """Record once what an action would have done, and tell the admins (pause or observe)."""
    key = would_have_key(match.rule, match.verdict)
    if lease.warnings.has(key):
        return  # recorded before this pass began
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None or row.warnings.has(key):
            return
        row.warnings = row.warnings.with_would_have(key, at=run.now, why=why)
        session.add(row)
        record(
            session,
            at=run.now,
            actor=SWEEPER,
            tag=AuditTag.SWEEP_WOULD_HAVE,
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
    if lease.warnings.has(key):
        return  # told before this pass began
    with run.ctx.db.write() as session:
        row = _locked(session, lease)
        if row is None or row.warnings.has(key):
            return
        row.warnings = row.warnings.with_notice(key, at=run.now)
        session.add(row)
        record(
            session,
            at=run.now,
            actor=SWEEPER,
            tag=AuditTag.SWEEP_NOTIFIED,
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
        if row is not None and row.warnings.has(key):
            row.warnings = row.warnings.without(key)
            session.add(row)


def tell_admins(run: Pass, session: Session, subject: str, text: str) -> None:
    notices.tell_admins(
        session, run.ctx.policy.admins, subject, text, at=run.now, now=run.ctx.now()
    )
