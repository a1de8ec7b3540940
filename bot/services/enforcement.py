"""The `signal` enforcer's bookkeeping: orders written with a reclaim, handed to the node's
agent with its next push, and the agent's results recorded (audit `enforce:ordered`,
`enforce:done`). The signalling itself happens on the node (bot.agent.enforcer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlmodel import Session

from bot.services.context import Context, record
from rules.lease_facts import LeaseSnapshot, Reading
from storage import enforcement as orders
from storage.audit import AuditTag
from storage.tables import EnforcementRow

ENFORCER = "gpubot"
TERM_GRACE_S = 30  # SIGTERM -> SIGKILL, as Slurm's KillWait and Kubernetes' default grace
PENDING, SENT, DONE = "pending", "sent", "done"


def order(
    session: Session,
    ctx: Context,
    lease: LeaseSnapshot,
    reading: Callable[[str, int], Reading | None],
    now: datetime,
) -> list[EnforcementRow]:
    """In the reclaim's transaction: one pending order per node of the lease, aimed only at
    the holder's processes on the lease's GPUs whose start time is known."""
    accounts = {unix for unix, slack in ctx.policy.accounts.items() if slack == lease.holder}
    nodes: dict[str, list[int]] = {}
    for node, index in lease.slots:
        nodes.setdefault(node, []).append(index)
    written = []
    for node, indexes in nodes.items():
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
            outcome=f"{len(targets)} to signal" if targets else "nothing to signal",
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


def _targets(
    node: str,
    indexes: Sequence[int],
    accounts: set[str],
    reading: Callable[[str, int], Reading | None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    targets: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    seen: set[int] = set()
    for index in sorted(indexes):
        found = reading(node, index)
        if found is None:
            skipped.append({"gpu": index, "why": "no telemetry for this GPU"})
            continue
        for proc in found.processes:
            if proc.user not in accounts:
                why = f"belongs to {proc.user or 'an unknown user'}, not the holder"
                skipped.append({"gpu": index, "pid": proc.pid, "why": why})
            elif proc.started is None:
                why = "start time unknown: a reused PID could not be told apart"
                skipped.append({"gpu": index, "pid": proc.pid, "why": why})
            elif proc.pid not in seen:  # one process on several GPUs is signalled once
                seen.add(proc.pid)
                targets.append(
                    {"gpu": index, "pid": proc.pid, "started": proc.started, "user": proc.user}
                )
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
