"""What observe-only rules would have done, read back from the audit log, and the per-minute
history of a lease's GPUs after a would-have reclaim.

The sweep records a would-have as a `sweep:would-have` row naming the rule (`detail.rule`,
`detail.why` "observe"; "paused" rows are a paused enforced rule, not an observed one). A
request's decision row (`request:N`) lists its observed matches in `detail.would_have`. Other
`*:would-have` rows count when they name a rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from rules.observed import Afterwards
from storage.audit import AuditTag
from storage.tables import AuditRow, GpuMinuteRow, GpuRow, LeaseGpuRow, LeaseRow, NodeRow

_WOULD_HAVE_TAGS = (
    AuditTag.SWEEP_WOULD_HAVE,
    AuditTag.REQUEST_WOULD_HAVE,
    AuditTag.QUEUE_WOULD_HAVE,
    AuditTag.RECALL_WOULD_HAVE,
)
_DECIDED_TAGS = ("borrow:%", "extend:%", "queue:%")  # rows that may carry a request's decision
_MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class WouldHave:
    """One thing an observe-only rule would have done: to which subject (`lease:12`,
    `request:7`), what (`reclaim idle`, `ask managers`), and what really happened then
    (the request's outcome; "" for a sweep)."""

    at: datetime
    rule: str
    verdict: str
    subject: str
    actual: str = ""

    @property
    def lease_id(self) -> int | None:
        kind, _, number = self.subject.partition(":")
        return int(number) if kind == "lease" and number.isdigit() else None


def would_haves(session: Session, since: datetime, until: datetime) -> list[WouldHave]:
    """Every would-have of an observe-only rule recorded in [since, until), oldest first; a
    request counted once per rule (its first decision row names it)."""
    tagged = sa.or_(
        col(AuditRow.tag).in_([str(t) for t in _WOULD_HAVE_TAGS]),
        *(col(AuditRow.tag).like(pattern) for pattern in _DECIDED_TAGS),
    )
    stmt = (
        select(AuditRow)
        .where(col(AuditRow.at) >= since, col(AuditRow.at) < until, tagged)
        .order_by(col(AuditRow.id))
    )
    found: list[WouldHave] = []
    seen: set[tuple[str, str]] = set()
    for row in session.exec(stmt):
        for would in _read(row):
            if (would.rule, would.subject) in seen and would.subject.startswith("request:"):
                continue
            seen.add((would.rule, would.subject))
            found.append(would)
    return found


def _read(row: AuditRow) -> Iterator[WouldHave]:
    detail: dict[str, Any] = row.detail or {}
    if row.tag in _WOULD_HAVE_TAGS:
        rule = str(detail.get("rule") or row.deciding_rule or "")
        if rule and detail.get("why") != "paused":
            yield WouldHave(row.at, rule, row.outcome.removeprefix("would "), row.subject)
        return
    if not row.subject.startswith("request:"):
        return  # a grant repeats the request's decision under the lease
    for would in detail.get("would_have") or ():
        if isinstance(would, dict) and would.get("rule"):
            verdict = str(would.get("then", ""))
            yield WouldHave(row.at, str(would["rule"]), verdict, row.subject, row.outcome)


def afterwards(
    session: Session,
    lease_id: int,
    at: datetime,
    until: datetime,
    *,
    busy_pct: float,
) -> Afterwards:
    """The minutes from `at` until `until` of the GPUs lease `lease_id` held at `at`, each only
    while the lease still held it."""
    stmt = (
        select(NodeRow.name, GpuRow.index, LeaseRow.ended_at, LeaseGpuRow.released_at)
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .where(col(LeaseRow.id) == lease_id)
    )
    busy = ok = expected = 0
    ends: list[datetime | None] = []
    for node, index, ended_at, released_at in session.exec(stmt).all():
        end = released_at or ended_at
        if end is not None and end <= at:
            continue  # given back before the would-have
        ends.append(end)
        stop = min(end, until) if end is not None else until
        expected += _minutes_between(at, stop)
        worked, seen = _history(session, node, index, at, stop, busy_pct=busy_pct)
        busy, ok = busy + worked, ok + seen
    held_until = None if not ends or None in ends else max(e for e in ends if e is not None)
    return Afterwards(busy, ok, expected, held_until)


def _minutes_between(start: datetime, stop: datetime) -> int:
    """How many whole minutes begin at or after `start` and end by `stop`."""
    first = start.replace(second=0, microsecond=0)
    if first < start:
        first += _MINUTE
    return max(0, int((stop - first) // _MINUTE))


def _history(
    session: Session, node: str, index: int, start: datetime, stop: datetime, *, busy_pct: float
) -> tuple[int, int]:
    """(busy minutes, minutes with a working reading) of one GPU in [start, stop)."""
    working = sa.and_(col(GpuMinuteRow.ok_samples) > 0, col(GpuMinuteRow.util_avg_pct).is_not(None))
    busy = sa.case((sa.and_(working, col(GpuMinuteRow.util_avg_pct) >= busy_pct), 1), else_=0)
    seen = sa.case((working, 1), else_=0)
    stmt = sa.select(
        sa.func.coalesce(sa.func.sum(busy), 0), sa.func.coalesce(sa.func.sum(seen), 0)
    ).where(
        col(GpuMinuteRow.node) == node,
        col(GpuMinuteRow.index) == index,
        col(GpuMinuteRow.minute) >= start,
        col(GpuMinuteRow.minute) < stop,
    )
    worked, observed = session.connection().execute(stmt).one()
    return int(worked), int(observed)
