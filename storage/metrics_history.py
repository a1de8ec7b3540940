"""The history counters /metrics exposes (requests by outcome, reclaims by reason, GPU-seconds
of ended leases): totals up to a time and up to ids, the leader's stored checkpoint of them,
and what came after, read in grouped queries.

Reads and the checkpoint's one write; callers own the session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col

from rules.domain import LeaseState
from storage.metrics import seconds_between
from storage.tables import LeaseGpuRow, LeaseRow, MetricsCheckpointRow, RequestRow, UtcDateTime

#: Lease states that may still change (a final lease's figures never do).
OPEN = (LeaseState.PENDING.value, LeaseState.QUEUED.value, LeaseState.ACTIVE.value)
#: Final leases that held GPUs: ended with `ended_at` (bot.services.leases.end_lease).
HELD_FINAL = (LeaseState.RELEASED.value, LeaseState.RECLAIMED.value, LeaseState.EXPIRED.value)
RECLAIMED = LeaseState.RECLAIMED.value

RequestKey = tuple[str, str, str, str]  # pool, team, kind, outcome
ReclaimKey = tuple[str, str, str]  # pool, team, reason
TeamKey = tuple[str, str]  # pool, team


@dataclass(frozen=True)
class Totals:
    """The history counters up to `upto` (None: the beginning, nothing counted): requests
    filed before it by (pool, team, kind, outcome), leases reclaimed before it by (pool, team,
    reason) and the GPU-seconds held by the leases that ended before it, by (pool, team);
    counted over the requests and leases whose ids go up to `request_id` and `lease_id`.

    A filed request and an ended lease never change again, so totals up to a time stay true
    once every transaction that could write before it has committed. A row written later
    with an earlier time (history written in bulk, a clock far behind) has an id beyond the
    ones counted, which is how `moved_on` finds it."""

    upto: datetime | None = None
    requests: dict[RequestKey, int] = field(default_factory=dict)
    reclaims: dict[ReclaimKey, int] = field(default_factory=dict)
    gpu_s: dict[TeamKey, float] = field(default_factory=dict)
    request_id: int = 0
    lease_id: int = 0

    def plus(self, more: Totals) -> Totals:
        """These totals and `more` (what came after them), up to `more.upto` and its ids."""
        return Totals(
            more.upto,
            _summed(self.requests, more.requests),
            _summed(self.reclaims, more.reclaims),
            _summed(self.gpu_s, more.gpu_s),
            max(self.request_id, more.request_id),
            max(self.lease_id, more.lease_id),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": [[*key, n] for key, n in sorted(self.requests.items())],
            "reclaims": [[*key, n] for key, n in sorted(self.reclaims.items())],
            "gpu_s": [[*key, s] for key, s in sorted(self.gpu_s.items())],
            "request_id": self.request_id,
            "lease_id": self.lease_id,
        }

    @classmethod
    def from_json(cls, upto: datetime, data: dict[str, Any]) -> Totals | None:
        """The stored totals (None: stored before they kept their ids, so the rows written
        late since cannot be told apart; counting the history again is the safe way)."""
        if "request_id" not in data or "lease_id" not in data:
            return None
        return cls(
            upto,
            {(str(p), str(t), str(k), str(o)): int(n) for p, t, k, o, n in data["requests"]},
            {(str(p), str(t), str(r)): int(n) for p, t, r, n in data["reclaims"]},
            {(str(p), str(t)): float(sec) for p, t, sec in data["gpu_s"]},
            int(data["request_id"]),
            int(data["lease_id"]),
        )


def moved_on(session: Session, base: Totals, until: datetime) -> Totals:
    """`base` taken on to `until` (never back: a clock stepping back leaves `upto` where it
    is) and to the newest ids: the rows dated from `base.upto` to `until`, and the rows
    dated before `base.upto` but written after it was counted (ids beyond its own), found
    through the primary keys. Both read minutes of rows, not the history."""
    request_id, lease_id = newest_ids(session)
    if base.upto is not None and until < base.upto:
        until = base.upto
    late = Totals(base.upto)
    if base.upto is not None and (request_id, lease_id) != (base.request_id, base.lease_id):
        late = _totals(
            session,
            until,
            [*_after_id(session, col(RequestRow.id), base.request_id), _before(base.upto)],
            [*_after_id(session, col(LeaseRow.id), base.lease_id), _ended_before(base.upto)],
            every_state=False,
        )
    span = totals_between(session, base.upto, until) if until != base.upto else Totals(until)
    moved = base.plus(late).plus(span)
    return Totals(until, moved.requests, moved.reclaims, moved.gpu_s, request_id, lease_id)


def newest_ids(session: Session) -> tuple[int, int]:
    """The highest request id and lease id written (two probes of the primary keys)."""
    stmt = sa.select(
        sa.select(sa.func.max(col(RequestRow.id))).scalar_subquery(),
        sa.select(sa.func.max(col(LeaseRow.id))).scalar_subquery(),
    )
    request_id, lease_id = session.connection().execute(stmt).one()
    return int(request_id or 0), int(lease_id or 0)


def totals_between(session: Session, since: datetime | None, until: datetime | None) -> Totals:
    """The requests filed and the leases ended with `since` <= time < `until` (either end
    open: None). Grouped in SQL, so even the whole history reads no row into Python; a span
    after `since` (minutes, at each scrape) reads through the `created_at` and `ended_at`
    indexes alone, which is why the lease states are told apart in the grouping."""
    created, ended = col(RequestRow.created_at), col(LeaseRow.ended_at)
    return _totals(
        session,
        until,
        _span(session, created, since, until),
        _span(session, ended, since, until),
        every_state=since is None,
    )


def _totals(
    session: Session,
    until: datetime | None,
    asked_where: list[Any],
    ended_where: list[Any],
    *,
    every_state: bool,
) -> Totals:
    """The requests and ended leases `asked_where` and `ended_where` pick, counted. With
    `every_state` (the whole history) the final states pick the leases, from
    ix_lease_ended_state_team alone; otherwise the conditions' indexes do, and the grouping
    tells the states apart."""
    keys = (
        col(RequestRow.pool),
        col(RequestRow.team),
        col(RequestRow.kind),
        col(RequestRow.outcome),
    )
    asked = sa.select(*keys, sa.func.count()).where(*asked_where).group_by(*keys)
    requests = {(str(p), str(t), str(k), str(o)): int(n) for p, t, k, o, n in _rows(session, asked)}
    reclaims: dict[ReclaimKey, int] = {}
    held: dict[tuple[str, str, str], float] = {}
    state = col(LeaseRow.state)
    where = [*ended_where, *([state.in_(HELD_FINAL)] if every_state else [])]
    for how, pool, team, why, count, seconds in _rows(session, _ended(session, where)):
        if how == RECLAIMED:
            key = (str(pool), str(team), str(why or "unknown"))
            reclaims[key] = reclaims.get(key, 0) + int(count)
        team_state = (str(pool), str(team), str(how))
        held[team_state] = held.get(team_state, 0.0) + float(seconds or 0)
    for pool, team, how, seconds in _rows(session, _given_back(session, where, every_state)):
        team_state = (str(pool), str(team), str(how))
        held[team_state] = held.get(team_state, 0.0) + float(seconds or 0)
    gpu_s: dict[TeamKey, float] = {}
    for (pool, team, how), seconds in held.items():
        if how in HELD_FINAL:
            gpu_s[pool, team] = gpu_s.get((pool, team), 0.0) + max(0.0, seconds)
    return Totals(until, requests, reclaims, gpu_s)


# The GPU-seconds of an ended lease are counted as storage.metrics.active_leases counts them
# while it runs, so no lease GPU is read but the few a shrink gave back: `gpus` counts the
# GPUs it held to its end (storage.leases.give_back lowers it as it dates the others), each
# held from the grant to the end; a GPU given back, from the grant to its `released_at`.


def _ended(session: Session, where: list[Any]) -> Any:
    """The leases `where` picks by (state, pool, team, end reason): how many, and the
    GPU-seconds of the GPUs they held to their end. Grouped in the order of
    ix_lease_ended_state_team, which can then be read in order, with no sort."""
    lease = LeaseRow
    keys = (col(lease.state), col(lease.pool), col(lease.team), col(lease.end_reason))
    held = col(lease.gpus) * seconds_between(session, col(lease.granted_at), col(lease.ended_at))
    return sa.select(*keys, sa.func.count(), sa.func.sum(held)).where(*where).group_by(*keys)


def _given_back(session: Session, where: list[Any], every_state: bool) -> Any:
    """The GPU-seconds of the GPUs a shrink gave back, of the leases `where` picks, by (pool,
    team, state)."""
    released = col(LeaseGpuRow.released_at)
    seconds: Any = seconds_between(session, col(LeaseRow.granted_at), released)
    if every_state:
        # Over the whole history: from the GPUs given back (ix_lease_gpu_given_back), each
        # lease found by its key, not from every ended lease probing for GPUs given back.
        seconds, where = sa.case((sa.and_(*where), seconds)), []
    keys = (col(LeaseRow.pool), col(LeaseRow.team), col(LeaseRow.state))
    return (
        sa.select(*keys, sa.func.sum(seconds))
        .select_from(LeaseGpuRow)
        .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
        .where(released.is_not(None), *where)
        .group_by(*keys)
    )


def _span(
    session: Session, column: Any, since: datetime | None, until: datetime | None
) -> list[Any]:
    where = [column.is_not(None)]
    if since is not None:
        after = column >= sa.bindparam(None, since, UtcDateTime())
        if session.get_bind().dialect.name == "sqlite":
            # SQLite keeps no statistics: told that few rows are this recent, it reads them
            # through the time's index instead of scanning an index that suits the grouping.
            after = sa.func.likelihood(after, sa.literal_column("0.001"))
        where.append(after)
    if until is not None:
        where.append(column < sa.bindparam(None, until, UtcDateTime()))
    return where


def _after_id(session: Session, column: Any, seen: int) -> list[Any]:
    """Rows with ids beyond `seen`: few, read through the primary key (told so on SQLite, as
    in `_span`, or it would walk the time's index over the whole history)."""
    after = column > seen
    if session.get_bind().dialect.name == "sqlite":
        after = sa.func.likelihood(after, sa.literal_column("0.001"))
    return [after]


def _before(upto: datetime) -> Any:
    return col(RequestRow.created_at) < sa.bindparam(None, upto, UtcDateTime())


def _ended_before(upto: datetime) -> Any:
    ended = col(LeaseRow.ended_at)
    return sa.and_(ended.is_not(None), ended < sa.bindparam(None, upto, UtcDateTime()))


def checkpoint(session: Session) -> Totals | None:
    """The totals the leader last stored (None: never yet, or stored before they kept their
    ids)."""
    row = session.get(MetricsCheckpointRow, 1)
    return None if row is None else Totals.from_json(row.upto, row.totals)


def store_checkpoint(session: Session, totals: Totals, at: datetime) -> bool:
    """Keep `totals` as the checkpoint, unless the one stored already reaches as far, in time
    and in ids (a checkpoint only moves on); whether it was written."""
    assert totals.upto is not None
    row = session.get(MetricsCheckpointRow, 1, with_for_update=True)
    if row is not None:
        stored = Totals.from_json(row.upto, row.totals)
        if stored is not None and _reaches(stored, totals):
            return False
    row = row or MetricsCheckpointRow(id=1)
    row.upto, row.totals, row.written_at = totals.upto, totals.as_json(), at
    session.add(row)
    return True


def _reaches(stored: Totals, totals: Totals) -> bool:
    assert stored.upto is not None
    assert totals.upto is not None
    if stored.upto != totals.upto:
        return stored.upto > totals.upto
    return (stored.request_id, stored.lease_id) >= (totals.request_id, totals.lease_id)


def _summed(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> dict[Any, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + value
    return out


def _rows(session: Session, stmt: Any) -> Any:
    return session.connection().execute(stmt)
