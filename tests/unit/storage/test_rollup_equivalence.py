"""The hourly rollup against a plain reference: every minute of the hour joined to every lease
interval holding it in one grouped statement, the minutes at the intervals' ends cut from what
the database reads for them. On random fleets, leases and minutes, both give the same rows."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session, col

from rules.domain import LeaseState
from storage import rollups
from storage.db import Database
from storage.rollup_spans import HOUR, MINUTE_S, Held, Minutes, aware, floor_minute
from storage.tables import (
    GpuMinuteRow,
    GpuRow,
    LeaseGpuRow,
    LeaseRow,
    NodeRow,
    PoolRow,
)

T = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
BUSY_PCT = 5.0
NEVER_HELD = (LeaseState.PENDING, LeaseState.QUEUED, LeaseState.DENIED, LeaseState.CANCELLED)


def a_random_history(session: Session, rng: random.Random, *, hours: int) -> None:
    """Two pools of nodes, a node in no pool's GPU list; leases of seconds to hours, on the
    minute or not, with gaps of none to minutes (so some share a minute), a few on two GPUs,
    some giving one back, some refused, the last ones still running; minutes missing, failed
    or at any use."""
    gpus = _a_fleet(session)
    for gpu_id in gpus:
        at = T - _a_while(rng, 5400)
        while at < T + hours * HOUR:
            end = at + max(_a_while(rng, 9000), timedelta(seconds=1))
            _a_lease(session, rng, gpu_id, at, end, running=end >= T + hours * HOUR, gpus=gpus)
            at = end + rng.choice((timedelta(0), _a_while(rng, 50), _a_while(rng, 1800)))
    with_stray = [(node, index) for node, index in session.execute(
        sa.select(col(NodeRow.name), col(GpuRow.index)).join(
            NodeRow, col(NodeRow.id) == col(GpuRow.node_id)
        )
    ).all()] + [("stray-node", 0)]  # fmt: skip
    for node, index in with_stray:
        for k in range(-60, hours * 60 + 60):
            if rng.random() >= 0.05:  # else never stored
                session.add(_a_minute(rng, node, index, T + timedelta(minutes=k)))
    session.flush()


def _a_fleet(session: Session) -> list[int]:
    for pool in ("a100", "l40s"):
        session.add(PoolRow(name=pool))
    session.flush()
    gpus: list[int] = []
    for n, pool in enumerate(("a100", "a100", "l40s")):
        node = NodeRow(name=f"{pool}-node-{n}", pool=pool)
        session.add(node)
        session.flush()
        assert node.id is not None
        for index in range(3):
            gpu = GpuRow(node_id=node.id, index=index, pool=pool)
            session.add(gpu)
            session.flush()
            assert gpu.id is not None
            gpus.append(gpu.id)
    return gpus


def _a_while(rng: random.Random, most_s: float) -> timedelta:
    """Up to `most_s` seconds: whole minutes half the time, any fraction of a second else."""
    if rng.random() < 0.5:
        return timedelta(minutes=rng.randrange(int(most_s // 60) + 1))
    return timedelta(seconds=rng.uniform(0, most_s))


def _a_lease(
    session: Session,
    rng: random.Random,
    gpu_id: int,
    at: datetime,
    end: datetime,
    *,
    running: bool,
    gpus: list[int],
) -> None:
    state = rng.choice(("released",) * 8 + ("denied", "reclaimed"))
    lease = LeaseRow(
        holder=f"U{rng.randrange(4)}",
        team=rng.choice(("vision", "nlp")),
        pool="a100",
        gpus=1,
        state="active" if running and state != "denied" else state,
        granted_at=at,
        expires_at=end,
        ended_at=None if running else end,
    )
    session.add(lease)
    session.flush()
    assert lease.id is not None
    given_back = at + (end - at) * rng.uniform(0, 1) if rng.random() < 0.2 else None
    session.add(
        LeaseGpuRow(lease_id=lease.id, gpu_id=gpu_id, active=running, released_at=given_back)
    )
    if rng.random() < 0.1:  # a second GPU, over what its own leases hold
        other = rng.choice([g for g in gpus if g != gpu_id])
        session.add(LeaseGpuRow(lease_id=lease.id, gpu_id=other, active=False))
    session.flush()


def _a_minute(rng: random.Random, node: str, index: int, minute: datetime) -> GpuMinuteRow:
    ok = 0 if rng.random() < 0.05 else 2
    util = None
    if ok and rng.random() >= 0.02:
        util = rng.choice((0.0, 4.999, BUSY_PCT, rng.uniform(0, 100)))
    return GpuMinuteRow(
        node=node,
        index=index,
        minute=minute,
        util_avg_pct=util,
        memory_used_max_mib=rng.randrange(100_000) if ok else None,
        samples=2,
        ok_samples=ok,
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_rollup_gives_the_rows_the_plain_join_gives(database: Database, seed: int) -> None:
    """Every hour of random histories: the same rows, to the last figure."""
    rng = random.Random(seed)
    with database.write() as session:
        a_random_history(session, rng, hours=3)
    with database.read() as session:
        spans = rollups.held(session, T - HOUR, T + 4 * HOUR)
        for hour in rollups.hours(T - HOUR, T + 4 * HOUR):
            expected = reference_hour_rows(session, hour, spans)
            actual = rollups.hour_rows(session, hour, spans, busy_pct=BUSY_PCT)
            assert sorted(expected, key=_key) == sorted(actual, key=_key)
            assert expected, "a history that rolls to no rows proves nothing"


def _key(row: dict[str, Any]) -> tuple[str, int, int]:
    return row["node"], row["index"], row["lease_id"]


# ---- the reference: one grouped join of the minutes to the intervals -----------------------


def reference_hour_rows(
    session: Session, hour: datetime, spans: Sequence[Held]
) -> list[dict[str, Any]]:
    mine = [s for s in spans if s.seconds_in(hour) > 0]
    minutes = _joined_minutes(session, hour, mine)
    free_busy_s = _cut(session, hour, mine, minutes)
    rows = [
        rollups._leased(hour, s, minutes.pop((s.node, s.index, s.lease_id), None)) for s in mine
    ]
    for (node, index, lease), m in minutes.items():
        if lease == 0 and m.busy_s > 0:
            free_busy_s[node, index] += m.busy_s
    pools = rollups._pools(session)
    for (node, index), busy_s in sorted(free_busy_s.items()):
        if busy_s >= 0.001 and (node, index) in pools:
            free = minutes.get((node, index, 0))
            rows.append(
                rollups._unreserved(
                    hour,
                    node,
                    index,
                    pools[node, index],
                    busy_s=rollups._ms(busy_s),
                    peak_mib=free.memory_peak_mib if free is not None else None,
                )
            )
    return rows


def _joined_minutes(
    session: Session, hour: datetime, spans: Sequence[Held]
) -> dict[tuple[str, int, int], Minutes]:
    m = GpuMinuteRow
    observed = sa.and_(col(m.ok_samples) > 0, col(m.util_avg_pct).is_not(None))
    busy = sa.and_(observed, col(m.util_avg_pct) >= BUSY_PCT)
    end = sa.func.coalesce(col(LeaseGpuRow.released_at), col(LeaseRow.ended_at))
    if session.connection().dialect.name == "sqlite":
        from_minute = sa.func.strftime("%Y-%m-%d %H:%M:00.000000", col(LeaseRow.granted_at))
    else:
        from_minute = sa.func.date_trunc("minute", col(LeaseRow.granted_at))
    iv = (
        sa.select(
            col(LeaseRow.id).label("lease_id"),
            col(NodeRow.name).label("node"),
            col(GpuRow.index).label("index"),
            end.label("end"),
            from_minute.label("from_minute"),
        )
        .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
        .join(GpuRow, col(GpuRow.id) == col(LeaseGpuRow.gpu_id))
        .join(NodeRow, col(NodeRow.id) == col(GpuRow.node_id))
        .where(
            col(LeaseRow.id).in_(sorted({s.lease_id for s in spans})),
            col(LeaseRow.state).not_in(NEVER_HELD),
        )
        .subquery("held")
    )
    lease = sa.func.coalesce(iv.c.lease_id, 0)
    stmt = (
        sa.select(
            col(m.node),
            col(m.index),
            lease,
            sa.func.sum(sa.case((observed, 1), else_=0)),
            sa.func.sum(sa.case((busy, 1), else_=0)),
            sa.func.sum(sa.case((observed, col(m.util_avg_pct)), else_=0.0)),
            sa.func.max(col(m.memory_used_max_mib)),
        )
        .select_from(m)
        .outerjoin(
            iv,
            sa.and_(
                iv.c.node == col(m.node),
                iv.c.index == col(m.index),
                col(m.minute) >= iv.c.from_minute,
                sa.or_(iv.c.end.is_(None), col(m.minute) < iv.c.end),
            ),
        )
        .where(col(m.minute) >= hour, col(m.minute) < hour + HOUR)
        .group_by(lease, col(m.node), col(m.index))
    )
    return {
        (node, index, int(lease_id)): Minutes(
            int(seen) * MINUTE_S, int(worked) * MINUTE_S, float(util or 0.0) * MINUTE_S, peak
        )
        for node, index, lease_id, seen, worked, util, peak in session.execute(stmt).all()
    }


def _held_s(span: Held, minute: datetime) -> float:
    until = minute + timedelta(seconds=MINUTE_S)
    end = until if span.end is None else min(span.end, until)
    return max(0.0, (end - max(span.start, minute)).total_seconds())


def _cut(
    session: Session,
    hour: datetime,
    spans: Sequence[Held],
    minutes: dict[tuple[str, int, int], Minutes],
) -> defaultdict[tuple[str, int], float]:
    edges: defaultdict[tuple[str, int, datetime], list[Held]] = defaultdict(list)
    for span in spans:
        for at in {floor_minute(span.start), floor_minute(span.end or span.start)}:
            if hour <= at < hour + HOUR and 0 < _held_s(span, at) < MINUTE_S:
                edges[span.node, span.index, at].append(span)
    m = GpuMinuteRow
    read = {
        (node, index, aware(minute)): (int(ok), None if util is None else float(util))
        for node, index, minute, ok, util in session.execute(
            sa.select(
                col(m.node), col(m.index), col(m.minute), col(m.ok_samples), col(m.util_avg_pct)
            ).where(col(m.minute) >= hour, col(m.minute) < hour + HOUR)
        ).all()
    }
    free: defaultdict[tuple[str, int], float] = defaultdict(float)
    for key, held in edges.items():
        if key not in read:
            continue
        node, index, at = key
        ok, util = read[key]
        pct = util if ok > 0 and util is not None else None
        worked = pct is not None and pct >= BUSY_PCT
        covered = 0.0
        for span in held:
            held_s = _held_s(span, at)
            covered += held_s
            had = minutes.get((node, index, span.lease_id))
            if had is not None and pct is not None:
                cut = MINUTE_S - held_s
                minutes[node, index, span.lease_id] = Minutes(
                    had.observed_s - cut,
                    had.busy_s - cut * worked,
                    had.util_pct_s - pct * cut,
                    had.memory_peak_mib,
                )
        if worked and covered < MINUTE_S:
            free[node, index] += MINUTE_S - covered
    return free
