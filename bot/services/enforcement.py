"""The enforcers' orders: written with a reclaim (audit `enforce:ordered`), handed to the node
agents, and the agents' results recorded (`enforce:done`).

`signal`: the order goes to the node's agent with its next push and the agent's results come
back (the signalling itself happens on the node, bot.agent.enforcer). `slurm`, `kubernetes`:
the order waits `queued` until bot.services.scheduler_steps carries it out after the reclaim
committed, so no scheduler command runs inside a transaction. An admin's drain of a node waits
the same way, then drains (Slurm) or cordons (Kubernetes) it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlmodel import Session

from bot.enforcers import (
    KUBERNETES,
    SLURM,
)
from bot.services.context import Context, record
from bot.telemetry.model import ProcessInfo
from rules.lease_facts import LeaseSnapshot, Reading
from storage import enforcement as orders
from storage.audit import AuditTag
from storage.tables import EnforcementRow

ENFORCER = "gpubot"
TERM_GRACE_S = 30  # SIGTERM -> SIGKILL, as Slurm's KillWait and Kubernetes' default grace
PENDING, SENT, DONE = "pending", "sent", "done"
QUEUED = "queued"  # a scheduler order waiting for carry_out; agents never take these
MAX_TRIES = 10  # failed steps of one order or drain before it is given up (one a sweep)
MAX_COMMANDS = 40  # commands kept with an order for its audit row
# What a scheduler order targets: the part of ProcessInfo.job after the prefix.
_UNITS = {
    SLURM: ("slurm/", "job", "not in a Slurm job"),
    KUBERNETES: ("pod/", "pod", "not in a pod"),
}
# What a job id or pod uid looks like. The agent reads them from cgroups, but the bot never hands
# a scheduler anything else: a pushed "job" such as `--user=alice` would be an option to scancel.
_UNIT_NAME = {
    SLURM: re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?"),
    KUBERNETES: re.compile(r"[0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12}"),
}


def order(
    session: Session,
    ctx: Context,
    lease: LeaseSnapshot,
    reading: Callable[[str, int], Reading | None],
    now: datetime,
) -> list[EnforcementRow]:
    """In the reclaim's transaction: one order per node of the lease, aimed only at the
    holder's processes on the lease's GPUs: for `signal`, those whose start time is known;
    for `slurm` and `kubernetes`, their jobs or pods."""
    accounts = {unix for unix, slack in ctx.policy.accounts.items() if slack == lease.holder}
    nodes: dict[str, list[int]] = {}
    for node, index in lease.slots:
        nodes.setdefault(node, []).append(index)
    written = []
    scheduler = ctx.enforcer in _UNITS
    verb = {SLURM: "cancel", KUBERNETES: "evict"}.get(ctx.enforcer, "signal")
    for node, indexes in nodes.items():
        if scheduler:
            targets, skipped = _work(node, indexes, accounts, reading, ctx.enforcer)
        else:
            targets, skipped = _targets(node, indexes, accounts, reading)
        row = None
        if targets:
            row = EnforcementRow(
                created_at=now,
                lease_id=lease.id,
                node=node,
                targets=targets,
                term_grace_s=TERM_GRACE_S,
                dry_run=ctx.enforcer == "signal-dry-run",
                state=QUEUED if scheduler else PENDING,
                result={"enforcer": ctx.enforcer} if scheduler else {},
            )
            session.add(row)
            session.flush()
            written.append(row)
        record(
            session,
            at=now,
            actor=ENFORCER,
            tag=AuditTag.ENFORCE_ORDERED,
            subject=f"lease:{lease.id}",
            outcome=f"{len(targets)} to {verb}" if targets else f"nothing to {verb}",
            detail={
                "order": row.id if row else None,
                "node": node,
                "enforcer": ctx.enforcer,
                "accounts": sorted(accounts),
                "targets": targets,
                "not_targeted": skipped,
            },
        )
    return written


def _holders(
    node: str,
    indexes: Sequence[int],
    accounts: set[str],
    reading: Callable[[str, int], Reading | None],
    skipped: list[dict[str, Any]],
) -> Iterator[tuple[int, ProcessInfo]]:
    """The holder's processes on the lease's GPUs of `node`, GPU by GPU; what is not theirs,
    or cannot be seen, goes to `skipped` with the reason the audit shows."""
    for index in sorted(indexes):
        found = reading(node, index)
        if found is None:
            skipped.append({"gpu": index, "why": "no telemetry for this GPU"})
            continue
        for proc in found.processes:
            if proc.user in accounts:
                yield index, proc
            else:
                why = f"belongs to {proc.user or 'an unknown user'}, not the holder"
                skipped.append({"gpu": index, "pid": proc.pid, "why": why})


def _targets(
    node: str,
    indexes: Sequence[int],
    accounts: set[str],
    reading: Callable[[str, int], Reading | None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    targets: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    seen: set[int] = set()
    for index, proc in _holders(node, indexes, accounts, reading, skipped):
        if proc.started is None:
            why = "start time unknown: a reused PID could not be told apart"
            skipped.append({"gpu": index, "pid": proc.pid, "why": why})
        elif proc.pid not in seen:  # one process on several GPUs is signalled once
            seen.add(proc.pid)
            targets.append(
                {"gpu": index, "pid": proc.pid, "started": proc.started, "user": proc.user}
            )
    return targets, skipped


def _work(
    node: str,
    indexes: Sequence[int],
    accounts: set[str],
    reading: Callable[[str, int], Reading | None],
    kind: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The holder's Slurm jobs (or pods) on the GPUs, each once: what the scheduler ends.
    A process outside one is left alone, and the audit says so."""
    prefix, unit, outside = _UNITS[kind]
    targets: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, proc in _holders(node, indexes, accounts, reading, skipped):
        job = proc.job or ""
        if not job.startswith(prefix):
            skipped.append({"gpu": index, "pid": proc.pid, "why": outside})
        elif not _UNIT_NAME[kind].fullmatch(name := job.removeprefix(prefix)):
            why = f"{unit} {name[:40]!r} is not a {unit} id the scheduler gives"
            skipped.append({"gpu": index, "pid": proc.pid, "why": why})
        elif name not in seen:
            seen.add(name)
            targets.append({"gpu": index, unit: name, "pid": proc.pid, "user": proc.user})
    return targets, skipped


def take_orders(ctx: Context, node: str) -> list[dict[str, Any]]:
    """The node's pending orders as the agent reads them, marked sent in the same transaction."""
    now = ctx.now()
    with ctx.db.write() as session:
        rows = orders.lock_waiting_for(session, node, PENDING)
        out = []
        for row in rows:
            row.state, row.sent_at = SENT, now
            session.add(row)
            out.append(
                {
                    "id": row.id,
                    "lease": row.lease_id,
                    "targets": row.targets,
                    "term_grace_s": row.term_grace_s,
                    "dry_run": row.dry_run,
                }
            )
        return out


def record_results(
    ctx: Context, node: str, order_id: int, results: list[dict[str, Any]]
) -> str | None:
    """Mark an order done with what the agent reports; None, or why it was not recorded."""
    now = ctx.now()
    with ctx.db.write() as session:
        row = orders.lock(session, order_id)
        if row is None or row.node != node:
            return f"no order {order_id} for {node}"
        if row.state == DONE:
            return f"order {order_id} already has its results"
        row.state, row.done_at, row.result = DONE, now, {"results": results}
        session.add(row)
        outcomes = sorted({str(r.get("outcome", "")) for r in results})
        record(
            session,
            at=now,
            actor=f"agent:{node}"[:64],
            tag=AuditTag.ENFORCE_DONE,
            subject=f"lease:{row.lease_id}",
            outcome=(", ".join(outcomes) or "no targets")[:32],
            detail={"order": order_id, "node": node, "dry_run": row.dry_run, "results": results},
        )
    return None


def order_drain(session: Session, ctx: Context, node: str, user: str, reason: str) -> None:
    """In the admin's drain transaction: the scheduler drains (or cordons) the node too, at the
    next sweep. Nothing for the enforcers that leave the scheduler alone."""
    if ctx.enforcer not in _UNITS:
        return
    now = ctx.now()
    text = f"gpubot: drained by {user}" + (f": {reason}" if reason else "")
    orders.want_drain(session, orders.Drain(node, " ".join(text.split())), at=now, by=user)
    record(
        session,
        at=now,
        actor=ENFORCER,
        tag=AuditTag.ENFORCE_ORDERED,
        subject=f"node:{node}",
        outcome="drain" if ctx.enforcer == SLURM else "cordon",
        detail={"node": node, "enforcer": ctx.enforcer, "reason": text},
    )
