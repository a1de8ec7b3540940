"""Whether each node reports: silent when every GPU of it is, reporting when any of them
sends. A whole node that goes quiet (or comes back) is one lifecycle event, not one per GPU,
and admins hear once when it goes quiet and once when it is back.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from bot.services import notices
from bot.services.context import SYSTEM, Context, record
from bot.services.device_records import new_event
from rules.domain import Observed, Reporting
from storage.audit import AuditTag
from storage.gpus import ObservedGpu
from storage.tables import DeviceEventRow


def changes(
    gpus: list[ObservedGpu],
    updates: Mapping[int, Mapping[str, Any]],
    nodes: Mapping[str, str],
    *,
    since: datetime | None,
    now: datetime,
    events: list[DeviceEventRow],
) -> dict[str, tuple[str, str]]:
    """{node: (reporting state before, now)} for the nodes whose state changed: silent when
    every GPU of it is, reporting when any of them sends."""
    states: dict[str, list[str]] = {}
    for gpu in gpus:
        states.setdefault(gpu.node, []).append(
            updates.get(gpu.id, {}).get("observed", gpu.observed)
        )
    out = {}
    for node, observed in states.items():
        if since is None:
            now_state = Reporting.UNKNOWN
        elif all(s == Observed.SILENT for s in observed):
            now_state = Reporting.SILENT
        elif any(s in (Observed.EMPTY, Observed.OCCUPIED) for s in observed):
            now_state = Reporting.REPORTING
        else:
            continue  # still waiting for its first samples
        before = nodes.get(node, Reporting.UNKNOWN)
        if now_state != before:
            out[node] = (before, now_state.value)
            if now_state == Reporting.SILENT:
                events.append(new_event(now, node, None, "not-reporting", {"was": before}))
            elif before == Reporting.SILENT and now_state == Reporting.REPORTING:
                events.append(new_event(now, node, None, "back", {}))
    # A whole node that went quiet (or came back) is one event, not one per GPU.
    whole = {node for node, (_, state) in out.items()}
    events[:] = [
        e for e in events if not (e.gpu is not None and e.node in whole and e.kind in _EPISODE)
    ]
    return out


_EPISODE = ("not-reporting", "back")


def tell(
    ctx: Context, session: Session, changes: Mapping[str, tuple[str, str]], now: datetime
) -> None:
    """Admins hear once when a node goes quiet, and once when it is back."""
    after = ctx.policy.fleet.not_reporting_after
    for node, (before, state) in sorted(changes.items()):
        if state == Reporting.SILENT:
            tag = AuditTag.NODE_NOT_REPORTING
            text = (
                f"{node} has sent no telemetry for {_words(after)}: its GPUs are out of service "
                "until it reports again. Check its agent (or NVML), and its name in pools.yaml."
            )
        elif before == Reporting.SILENT and state == Reporting.REPORTING:
            tag, text = AuditTag.NODE_BACK, f"{node} reports again: its GPUs are back in service."
        else:
            continue
        record(session, at=now, actor=SYSTEM, tag=tag, subject=f"node:{node}", outcome=state)
        notices.tell_admins(session, ctx.policy.admins, f"node:{node}", text, at=now, now=ctx.now())


def _words(after: timedelta) -> str:
    seconds = int(after.total_seconds())
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"
