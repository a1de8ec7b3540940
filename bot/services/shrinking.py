"""Shrinking a lease: it gives back some GPUs and runs on with the rest, by the holder's
`/gpu release L7 gpus …` or `keep N`, the Give back button of a partly-idle warning, or the
sweep's `shrink idle`; and Keep, the holder's answer that stops the partly-idle warnings."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlmodel import Session

from bot.services import notices
from bot.services.context import Context, record
from bot.services.leases import to_change
from bot.services.reads import lease_view
from bot.services.results import GpuSlot, LeaseView, Refused, ShrinkResult
from rules.decision import Decision
from rules.domain import Observed
from rules.marks import PARTLY_IDLE
from rules.shrinking import Problem, Slot, gpu_name, to_give_back
from storage import leases as storage_leases
from storage.audit import AuditTag
from storage.tables import LeaseRow


def shrink(
    ctx: Context,
    user: str,
    lease_id: int,
    *,
    gpus: Sequence[Slot] = (),
    keep: int | None = None,
) -> ShrinkResult | Refused:
    """Give back the GPUs named (`gpus`), or all but `keep` of them, idle ones first."""
    now = ctx.now()
    with ctx.db.write() as session:
        lease = to_change(ctx, session, user, lease_id)
        if isinstance(lease, Refused):
            return lease
        seen = storage_leases.held_seen(session, lease_id)
        chosen = to_give_back(
            f"L{lease_id}",
            [(node, index) for node, index, _ in seen],
            named=gpus,
            keep=keep,
            idle=lease.warnings.idle_slots(),
            empty={(node, index) for node, index, seen_as in seen if seen_as == Observed.EMPTY},
        )
        if isinstance(chosen, Problem):
            return Refused(chosen.text, chosen.code)
        why = f"keep {keep}" if keep is not None else "the GPUs named"
        return shrink_in(session, ctx, lease, chosen, actor=user, why=why, now=now)


def give_back_idle(ctx: Context, user: str, lease_id: int) -> ShrinkResult | Refused:
    """The Give back button: the idle GPUs the standing partly-idle warning names."""
    now = ctx.now()
    with ctx.db.write() as session:
        lease = to_change(ctx, session, user, lease_id)
        if isinstance(lease, Refused):
            return lease
        named = lease.warnings.idle_slots()
        if not named:
            return Refused(
                f"The idle-GPU warning on L{lease_id} no longer stands (its GPUs got busy, or it "
                f"was answered), so nothing was given back. `/gpu release L{lease_id} gpus "
                "node:2,3` gives back the GPUs you choose.",
                "no-idle",
            )
        held = storage_leases.slots_of(session, lease_id)
        chosen = to_give_back(f"L{lease_id}", held, named=[s for s in named if s in held])
        if isinstance(chosen, Problem):
            return Refused(chosen.text, chosen.code)
        return shrink_in(session, ctx, lease, chosen, actor=user, why="idle", now=now)


def shrink_in(
    session: Session,
    ctx: Context,
    lease: LeaseRow,
    slots: Sequence[Slot],
    *,
    actor: str,
    why: str,
    now: datetime,
    decision: Decision | None = None,
) -> ShrinkResult:
    """Give back `slots` in the caller's transaction: the GPU set and the count change
    together, audited as lease:shrunk; the partly-idle warning is answered by it."""
    assert lease.id is not None
    given = [gpu_name(slot) for slot in slots]
    storage_leases.give_back(session, lease, list(slots), at=now)
    lease.warnings = lease.warnings.without(PARTLY_IDLE)
    session.add(lease)
    record(
        session,
        at=now,
        actor=actor,
        tag=AuditTag.LEASE_SHRUNK,
        subject=f"lease:{lease.id}",
        decision=decision,
        outcome="shrunk",
        detail={"gave_back": given, "kept": lease.gpus, "why": why},
    )
    if actor != lease.holder:
        who = "the idle-GPU rules" if decision is not None else "an admin"
        notices.tell(
            session,
            lease.holder,
            f"lease:{lease.id}",
            f"L{lease.id} gave back {', '.join(given)} ({why}, by {who}); it runs on with "
            f"{lease.gpus} GPU{'s' if lease.gpus != 1 else ''} until it ends as planned.",
            at=now,
        )
    notices.lease_changed(session, lease.id, lease.holder, at=now)  # its grant DM shows the rest
    notices.waiting_cards(session, lease.pool, at=now, besides=None)
    return ShrinkResult(lease_view(session, lease), tuple(GpuSlot(*slot) for slot in slots))


def keep_all(ctx: Context, user: str, lease_id: int) -> LeaseView | Refused:
    """The Keep button: every GPU stays, and no more partly-idle warnings for this lease."""
    now = ctx.now()
    with ctx.db.write() as session:
        lease = to_change(ctx, session, user, lease_id)
        if isinstance(lease, Refused):
            return lease
        if not lease.warnings.kept:
            lease.warnings = lease.warnings.with_kept(at=now)
            session.add(lease)
            record(
                session,
                at=now,
                actor=user,
                tag=AuditTag.LEASE_KEPT,
                subject=f"lease:{lease.id}",
                outcome="kept",
                detail={"gpus": lease.gpus},
            )
            notices.lease_changed(session, lease.id, lease.holder, at=now)  # the warning answered
        return lease_view(session, lease)
