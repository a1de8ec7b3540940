"""Carrying out the scheduler enforcers' queued orders and drains (`slurm`, `kubernetes`): the
leader's sweep job runs `carry_out` after the reclaim committed, one step of each at a time, and
records every step that settled or failed (`enforce:done`). A failed step is tried again at the
next sweep, MAX_TRIES times at most. The commands themselves are bot.enforcers'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.enforcers import Enforcer, EnforcerUnavailableError, Order, Step, build
from bot.services.context import Context, record
from bot.services.enforcement import DONE, ENFORCER, MAX_COMMANDS, MAX_TRIES, QUEUED
from storage import enforcement as orders
from storage.audit import AuditTag
from storage.nodes import named as node_named
from storage.tables import EnforcementRow

log = logging.getLogger(__name__)


def carry_out(ctx: Context, hands: Callable[[], Enforcer | None]) -> list[str]:
    """The next step of every queued scheduler order and waiting drain (the leader's sweep job
    calls this after the sweep committed); one line per step that settled or failed. `hands`
    gives the enforcer, built only when something waits."""
    with ctx.db.read() as session:
        queued = [_as_order(row) for row in orders.waiting(session, QUEUED)]
        drains = orders.drains(session)
    if not queued and not drains:
        return []
    try:
        enforcer, unavailable = hands(), ""
    except EnforcerUnavailableError as exc:
        enforcer, unavailable = None, str(exc)
    lines = []
    for kind, order in queued:
        now = ctx.now()
        if unavailable:
            step = Step([], [], done=False, error=unavailable, progress=dict(order.progress))
        elif enforcer is None or enforcer.name != kind:
            running = enforcer.name if enforcer else ctx.enforcer
            why = f"ordered for {kind}, but the bot now runs the {running} enforcer"
            step = Step([], [], done=True, error=why, progress=dict(order.progress))
        else:
            _still_leading(ctx)
            step = _step(order.progress, enforcer.reclaim, order, now)
        lines += _record_step(ctx, kind, order, step, now)
    for drain in drains:
        lines += _drain(ctx, enforcer, unavailable, drain)
    for line in lines:
        log.info("enforce: %s", line)
    return lines


def _still_leading(ctx: Context) -> None:
    """Right before a scheduler command: an empty write, which the leader's fence checks (it
    raises when another replica leads now), so a deposed leader never cancels or evicts what
    it could not then record. Without replicas it only costs a begin and a commit."""
    with ctx.db.write():
        pass


def _step(progress: Mapping[str, Any], take: Callable[..., Step], *args: Any) -> Step:
    """The enforcer's step; a bug in it fails this try of this order only, never the others
    nor the sweep job (it is logged with its traceback and recorded)."""
    try:
        return take(*args)
    except Exception as exc:
        log.exception("enforce: a step failed unexpectedly")
        return Step(
            [], [], done=False, error=f"internal error: {exc!r}"[:300], progress=dict(progress)
        )


class Hands:
    """The enforcer `carry_out` works with, built when first needed and kept (a Kubernetes
    client is set up once); a failed build is tried again the next time."""

    def __init__(self, kind: str, kubeconfig: Path | None = None) -> None:
        self.kind, self.kubeconfig = kind, kubeconfig
        self._built: Enforcer | None = None

    def __call__(self) -> Enforcer | None:
        if self._built is None:
            self._built = build(self.kind, self.kubeconfig)
        return self._built


def _as_order(row: EnforcementRow) -> tuple[str, Order]:
    result = row.result or {}
    return str(result.get("enforcer", "")), Order(
        id=int(row.id or 0),
        lease=row.lease_id,
        node=row.node,
        targets=list(row.targets),
        term_grace_s=row.term_grace_s,
        progress=dict(result.get("progress") or {}),
    )


def _record_step(ctx: Context, kind: str, order: Order, step: Step, now: datetime) -> list[str]:
    """Keep the step with the order; audit it when it settled the order or failed."""
    with ctx.db.write() as session:
        row = orders.lock(session, order.id)
        if row is None or row.state != QUEUED:
            return []  # settled meanwhile (an admin, or another process)
        before = row.result or {}
        tries = int(before.get("tries", 0)) + (1 if step.error else 0)
        commands = [*before.get("commands", []), *step.commands][-MAX_COMMANDS:]
        gave_up = bool(step.error) and not step.done and tries >= MAX_TRIES
        finished = step.done or gave_up
        row.result = {
            "enforcer": kind,
            "progress": step.progress,
            "tries": tries,
            "commands": commands,
            "results": step.results,
        } | ({"error": step.error} if step.error else {})
        if finished:
            row.state, row.done_at = DONE, now
        session.add(row)
        if not (finished or step.error):
            return []  # waiting (Slurm's grace): nothing new to say
        outcome = _outcome(step, tries, gave_up)
        record(
            session,
            at=now,
            actor=f"enforcer:{kind or ctx.enforcer}"[:64],
            tag=AuditTag.ENFORCE_DONE,
            subject=f"lease:{order.lease}",
            outcome=outcome[:32],
            detail={
                "order": order.id,
                "node": order.node,
                "enforcer": kind,
                "results": step.results,
                "commands": commands if finished else step.commands,
                "tries": tries,
                "error": step.error,
            },
        )
    return [f"L{order.lease} {order.node}: {outcome}"]


def _outcome(step: Step, tries: int, gave_up: bool) -> str:
    """The audit row's outcome: what the targets came to, or how the step failed."""
    if gave_up:
        return f"gave up after {tries} tries"
    if step.error:
        return f"failed, retry {tries} of {MAX_TRIES}" if not step.done else "not carried out"
    return ", ".join(sorted({str(r["outcome"]) for r in step.results})) or "nothing"


def _drain(
    ctx: Context, enforcer: Enforcer | None, unavailable: str, drain: orders.Drain
) -> list[str]:
    """Drain (cordon) the node in the scheduler, unless it was undrained meanwhile."""
    with ctx.db.read() as session:
        node = node_named(session, drain.node)
        wanted = node is not None and node.drained
    if not wanted:
        step = Step([], [], done=True, error="undrained since: not carried out")
    elif unavailable or enforcer is None:
        why = unavailable or f"the bot now runs the {ctx.enforcer} enforcer"
        step = Step([], [], done=enforcer is None and not unavailable, error=why)
    else:
        _still_leading(ctx)
        step = _step({}, enforcer.drain, drain.node, drain.reason)
    now = ctx.now()
    tries = drain.tries + (1 if step.error else 0)
    gave_up = bool(step.error) and not step.done and tries >= MAX_TRIES
    with ctx.db.write() as session:
        if step.done or gave_up:
            orders.drop_drain(session, drain.node)
        else:
            retry = orders.Drain(drain.node, drain.reason, tries)
            orders.want_drain(session, retry, at=now, by=ENFORCER)
        outcome = _outcome(step, tries, gave_up)
        kind = enforcer.name if enforcer else ctx.enforcer
        record(
            session,
            at=now,
            actor=f"enforcer:{kind}"[:64],
            tag=AuditTag.ENFORCE_DONE,
            subject=f"node:{drain.node}",
            outcome=outcome[:32],
            detail={
                "node": drain.node,
                "enforcer": kind,
                "reason": drain.reason,
                "results": step.results,
                "commands": step.commands,
                "tries": tries,
                "error": step.error,
            },
        )
    return [f"{drain.node}: {outcome}"]
