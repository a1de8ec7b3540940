"""The hourly rollup: GPU-hours allocated, used, busy, idle, unknown and unreserved, per GPU,
hour and lease, from stored minutes and lease intervals; hand-computed, replaced on a second
run, and pruned."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import Session, col, select

from storage import leases, rollups, usage
from storage.db import Database
from storage.tables import GpuHourRow, GpuMinuteRow, GpuRow, LeaseGpuRow, LeaseRow, NodeRow, PoolRow
from tests.support import postgres
from tests.unit.storage.builders import a_lease

T = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
H = timedelta(hours=1)
NODE = "a100-node-01"
BUSY_PCT = 5.0


def a_fleet(session: Session) -> list[int]:
    """Pool a100: one node of two GPUs, and a node in no pool's list of GPUs is left out."""
    session.add(PoolRow(name="a100"))
    session.flush()
    node = NodeRow(name=NODE, pool="a100")
    session.add(node)
    session.flush()
    assert node.id is not None
    gpus = [GpuRow(node_id=node.id, index=i, pool="a100") for i in range(2)]
    session.add_all(gpus)
    session.flush()
    return [g.id for g in gpus if g.id is not None]


def minutes(
    session: Session,
    index: int,
    start: datetime,
    count: int,
    util: float | None,
    *,
    ok: int = 2,
    node: str = NODE,
    memory_mib: int | None = 1000,
) -> None:
    """`count` stored minutes of one GPU from `start`, each at `util` % (ok readings)."""
    session.add_all(
        GpuMinuteRow(
            node=node,
            index=index,
            minute=start + timedelta(minutes=m),
            util_avg_pct=util,
            util_max_pct=util,
            memory_used_max_mib=memory_mib if ok else None,
            samples=2,
            ok_samples=ok,
        )
        for m in range(count)
    )
    session.flush()


def ended(session: Session, lease_id: int, at: datetime) -> None:
    """The lease ends `at`, letting go of its GPUs."""
    lease = session.get(LeaseRow, lease_id)
    assert lease is not None
    lease.state, lease.ended_at = "released", at
    session.add(lease)
    session.execute(
        sa.update(LeaseGpuRow).where(col(LeaseGpuRow.lease_id) == lease_id).values(active=False)
    )
    session.flush()


Row = tuple[datetime, int, int, float, float, float, float, float, float]


def stored(database: Database) -> list[Row]:
    """(hour, index, lease, allocated, used, busy, idle, unknown, unreserved), in order."""
    with database.read() as session:
        rows = session.exec(
            select(GpuHourRow).order_by(
                col(GpuHourRow.hour), col(GpuHourRow.index), col(GpuHourRow.lease_id)
            )
        ).all()
    return [
        (r.hour, r.index, r.lease_id, r.allocated_s, r.used_s, r.busy_s, r.idle_s,
         r.unknown_s, r.unreserved_s)
        for r in rows
    ]  # fmt: skip


def fill(database: Database, since: datetime, until: datetime) -> int:
    with database.write() as session:
        return rollups.fill(session, since, until, busy_pct=BUSY_PCT)


def test_two_gpus_three_hours_at_half_use_are_six_allocated_and_three_used(
    database: Database,
) -> None:
    """2 GPUs x 3 h at 50 %: 6 GPU-h allocated, 3 used (efficiency 0.5), all busy."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T, gpu_ids=gpus)
        ended(session, lease, T + 3 * H)
        for index in (0, 1):
            minutes(session, index, T, 180, 50.0)
    assert 6 == fill(database, T, T + 3 * H)
    rows = stored(database)
    expected = [
        (T + h * H, i, lease, 3600.0, 1800.0, 3600.0, 0.0, 0.0, 0.0)
        for h in range(3)
        for i in (0, 1)
    ]
    assert expected == rows
    allocated, used = sum(r[3] for r in rows), sum(r[4] for r in rows)
    assert (6.0, 3.0, 0.5) == (allocated / 3600, used / 3600, used / allocated)
    with database.read() as session:
        row = session.exec(select(GpuHourRow)).first()
    assert row is not None
    assert ("a100", NODE, "vision", "U1", 1000) == (
        row.pool, row.node, row.team, row.holder, row.memory_peak_mib
    )  # fmt: skip


def test_stale_and_missing_minutes_are_unknown_never_idle(database: Database) -> None:
    """40 idle minutes, 10 whose readings all failed, 10 never stored: 40 min idle, 20 unknown."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T, gpu_ids=gpus[:1])
        minutes(session, 0, T, 40, 0.0)
        minutes(session, 0, T + timedelta(minutes=40), 10, None, ok=0)
    fill(database, T, T + H)
    assert [(T, 0, lease, 3600.0, 0.0, 0.0, 2400.0, 1200.0, 0.0)] == stored(database)


def test_a_lease_crossing_hours_splits_them_and_the_time_around_it_is_unreserved(
    database: Database,
) -> None:
    """Granted 10:20, ended 12:10, the GPU busy at 80 % from 10:00 to 13:00: 40, 60 and 10
    minutes held; the 20 minutes before and the 50 after are unreserved use."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T + timedelta(minutes=20), gpu_ids=gpus[:1])
        ended(session, lease, T + 2 * H + timedelta(minutes=10))
        minutes(session, 0, T, 180, 80.0)
    fill(database, T, T + 3 * H)
    assert [
        (T, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 1200.0),
        (T, 0, lease, 2400.0, 1920.0, 2400.0, 0.0, 0.0, 0.0),
        (T + H, 0, lease, 3600.0, 2880.0, 3600.0, 0.0, 0.0, 0.0),
        (T + 2 * H, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 3000.0),
        (T + 2 * H, 0, lease, 600.0, 480.0, 600.0, 0.0, 0.0, 0.0),
    ] == stored(database)


def test_a_minute_counts_for_a_lease_by_the_seconds_it_held(database: Database) -> None:
    """Granted 10:20:30, the GPU at 100 % from 10:20 to 11:00: 39.5 minutes held, all of them
    busy and used (the 30 s of 10:20 it held too); the first 30 s of 10:20 were nobody's."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T + timedelta(minutes=20, seconds=30), gpu_ids=gpus[:1])
        minutes(session, 0, T + timedelta(minutes=20), 40, 100.0)
    fill(database, T, T + H)
    assert [
        (T, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 30.0),
        (T, 0, lease, 2370.0, 2370.0, 2370.0, 0.0, 0.0, 0.0),
    ] == stored(database)


def test_a_lease_of_twenty_seconds_across_two_minutes_uses_twenty_seconds(
    database: Database,
) -> None:
    """Granted 10:00:50, ended 10:01:10, the GPU at 100 % in both minutes: 20 s allocated,
    20 s used and busy (efficiency 100 %, not 300 %); the other 100 s busy are unreserved."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T + timedelta(seconds=50), gpu_ids=gpus[:1])
        ended(session, lease, T + timedelta(minutes=1, seconds=10))
        minutes(session, 0, T, 2, 100.0)
    fill(database, T, T + H)
    assert [
        (T, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 100.0),
        (T, 0, lease, 20.0, 20.0, 20.0, 0.0, 0.0, 0.0),
    ] == stored(database)


def test_two_leases_sharing_a_minute_split_it_and_the_gap_is_unreserved(
    database: Database,
) -> None:
    """One lease ends 10:00:20, the next starts 10:00:40 on the same GPU, busy at 50 % through
    10:00 and idle after: 20 s busy each, 20 s unreserved; the second's idle minutes to 10:02
    are idle, the rest of its hour unknown (never below zero)."""
    with database.write() as session:
        gpus = a_fleet(session)
        first = a_lease(session, at=T - H, gpu_ids=gpus[:1])
        ended(session, first, T + timedelta(seconds=20))
        second = a_lease(session, at=T + timedelta(seconds=40), gpu_ids=gpus[:1], holder="U2")
        minutes(session, 0, T, 1, 50.0)
        minutes(session, 0, T + timedelta(minutes=1), 1, 0.0)
    fill(database, T, T + H)
    assert [
        (T, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 20.0),
        (T, 0, first, 20.0, 10.0, 20.0, 0.0, 0.0, 0.0),
        (T, 0, second, 3560.0, 10.0, 20.0, 60.0, 3480.0, 0.0),
    ] == stored(database)


def test_a_lease_crossing_midnight_is_counted_on_both_days(database: Database) -> None:
    """Granted 23:30 and still running: 30 minutes busy at 30 % on the first day, then an hour
    with no telemetry at all, all of it unknown."""
    night = datetime(2026, 3, 2, 23, 0, tzinfo=UTC)
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=night + timedelta(minutes=30), gpu_ids=gpus[:1])
        minutes(session, 0, night + timedelta(minutes=30), 30, 30.0)
    fill(database, night, night + 2 * H)
    assert [
        (night, 0, lease, 1800.0, 540.0, 1800.0, 0.0, 0.0, 0.0),
        (datetime(2026, 3, 3, tzinfo=UTC), 0, lease, 3600.0, 0.0, 0.0, 0.0, 3600.0, 0.0),
    ] == stored(database)


def test_a_gpu_given_back_stops_counting_for_the_lease(database: Database) -> None:
    """Two GPUs from 10:00, GPU 1 given back at 10:45 and still busy: GPU 0 counts two hours,
    GPU 1 45 minutes, and its use after that is unreserved."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T, gpu_ids=gpus)
        row = leases.lock(session, lease)
        assert row is not None
        leases.give_back(session, row, [(NODE, 1)], at=T + timedelta(minutes=45))
        minutes(session, 0, T, 120, 0.0)
        minutes(session, 1, T, 120, 60.0)
    fill(database, T, T + 2 * H)
    assert [
        (T, 0, lease, 3600.0, 0.0, 0.0, 3600.0, 0.0, 0.0),
        (T, 1, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 900.0),
        (T, 1, lease, 2700.0, 1620.0, 2700.0, 0.0, 0.0, 0.0),
        (T + H, 0, lease, 3600.0, 0.0, 0.0, 3600.0, 0.0, 0.0),
        (T + H, 1, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 3600.0),
    ] == stored(database)


def test_two_leases_in_one_hour_give_two_rows_and_idle_time_between_gives_none(
    database: Database,
) -> None:
    """One lease 10:00-10:30, another from 10:40, the GPU idle throughout."""
    with database.write() as session:
        gpus = a_fleet(session)
        first = a_lease(session, at=T, gpu_ids=gpus[:1])
        ended(session, first, T + timedelta(minutes=30))
        second = a_lease(session, at=T + timedelta(minutes=40), gpu_ids=gpus[:1], holder="U2")
        minutes(session, 0, T, 60, 1.0)
    fill(database, T, T + H)
    assert [
        (T, 0, first, 1800.0, 18.0, 0.0, 1800.0, 0.0, 0.0),
        (T, 0, second, 1200.0, 12.0, 0.0, 1200.0, 0.0, 0.0),
    ] == stored(database)


def test_busy_gpus_outside_any_pool_and_idle_free_gpus_give_no_rows(database: Database) -> None:
    with database.write() as session:
        a_fleet(session)
        minutes(session, 0, T, 60, 0.0)  # free and idle
        minutes(session, 0, T, 60, 90.0, node="stray-node")  # busy, in no pool
    assert 0 == fill(database, T, T + H)
    assert [] == stored(database)


def test_a_lease_that_never_held_gpus_counts_nothing(database: Database) -> None:
    with database.write() as session:
        gpus = a_fleet(session)
        a_lease(session, at=T, gpu_ids=gpus[:1], state="denied")
    assert 0 == fill(database, T, T + H)


def test_rolling_the_same_hours_twice_changes_nothing(database: Database) -> None:
    """The second run replaces every row of those hours with the same figures, and rows of
    hours outside the range stay."""
    with database.write() as session:
        gpus = a_fleet(session)
        a_lease(session, at=T + timedelta(minutes=20), gpu_ids=gpus)
        minutes(session, 0, T, 180, 80.0)
        minutes(session, 1, T, 90, None, ok=0)
    fill(database, T, T + 3 * H)
    first = stored(database)
    assert 7 == fill(database, T + H, T + 3 * H) + fill(database, T, T + H)
    assert first == stored(database)
    assert 7 == len(first)


def test_a_late_minute_changes_its_hour_when_rolled_again(database: Database) -> None:
    """An agent's push arriving late: the hour rolled again counts it."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T, gpu_ids=gpus[:1])
        minutes(session, 0, T, 30, 50.0)
    fill(database, T, T + H)
    with database.write() as session:
        minutes(session, 0, T + timedelta(minutes=30), 30, 50.0)
    fill(database, T, T + H)
    assert [(T, 0, lease, 3600.0, 1800.0, 3600.0, 0.0, 0.0, 0.0)] == stored(database)


def test_prune_deletes_only_the_hours_before_the_cutoff(database: Database) -> None:
    with database.write() as session:
        gpus = a_fleet(session)
        a_lease(session, at=T, gpu_ids=gpus[:1])
    fill(database, T, T + 4 * H)
    with database.write() as session:
        assert 2 == rollups.prune(session, T + 2 * H)
    assert [T + 2 * H, T + 3 * H] == [r[0] for r in stored(database)]


@pytest.mark.parametrize(
    ("minute_at", "granted_at", "since", "expected"),
    [
        pytest.param(T, T + H, T - H, T, id="the oldest minute"),
        pytest.param(T + H, T, T - H, T, id="the oldest grant"),
        pytest.param(T, T + H, T + 30 * timedelta(minutes=1), T + H, id="not before since"),
        pytest.param(None, None, T, None, id="nothing at all"),
    ],
)
def test_earliest_history(
    database: Database,
    minute_at: datetime | None,
    granted_at: datetime | None,
    since: datetime,
    expected: datetime | None,
) -> None:
    """Where a first rollup starts: the oldest minute or grant at or after `since`; a lease
    still running at `since` starts it at `since`."""
    with database.write() as session:
        gpus = a_fleet(session)
        if minute_at is not None:
            minutes(session, 0, minute_at, 1, 10.0)
        if granted_at is not None:
            a_lease(session, at=granted_at, gpu_ids=gpus[1:])
    with database.read() as session:
        assert expected == rollups.earliest(session, since)


def test_hours_are_whole_utc_hours() -> None:
    since = datetime(2026, 3, 2, 9, 59, 59, tzinfo=UTC)
    assert [T - H, T, T + H] == list(rollups.hours(since, T + 2 * H))


def test_held_usage_weights_the_minutes_at_the_ends_as_the_rollup_does(
    database: Database,
) -> None:
    """The 20-second lease (10:00:50 to 10:01:10 at 100 %) read from the minutes: 20 s held,
    used and busy; a window from 10:01:00 cuts it to its last 10 s."""
    with database.write() as session:
        gpus = a_fleet(session)
        lease = a_lease(session, at=T + timedelta(seconds=50), gpu_ids=gpus[:1])
        ended(session, lease, T + timedelta(minutes=1, seconds=10))
        minutes(session, 0, T, 2, 100.0)
    with database.read() as session:
        whole = usage.held_usage(session, "U1", T, T + H, busy_pct=BUSY_PCT, prices={})
        late = usage.held_usage(
            session, "U1", T + timedelta(minutes=1), T + H, busy_pct=BUSY_PCT, prices={}
        )
    assert (20.0, 20.0, 20.0, 0.0, 0.0) == (
        whole.allocated_s, whole.used_s, whole.busy_s, whole.idle_s, whole.unknown_s
    )  # fmt: skip
    assert (10.0, 10.0, 10.0, 0.0) == (late.allocated_s, late.used_s, late.busy_s, late.unknown_s)


def _a_writer_waits_on_an_hour(database: Database) -> None:
    """Return once a session waits for an advisory lock; fail if none does within 30 s."""
    waiting = sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    for _ in range(600):
        with database.read() as session:
            if session.execute(waiting).scalar_one() > 0:
                return
        time.sleep(0.05)
    pytest.fail("the second writer never waited for the first")


@pytest.mark.postgres
def test_two_writers_rolling_one_hour_at_once_leave_one_set_of_rows(
    postgres_server: postgres.PostgresServer,
) -> None:
    """A leader and the one taking over roll the same hour at once: the second waits for the
    first to commit, then replaces its rows instead of adding to them."""
    database = postgres_server.database_with_schema()
    try:
        with database.write() as session:
            gpus = a_fleet(session)
            lease = a_lease(session, at=T, gpu_ids=gpus)
            ended(session, lease, T + H)
            for index in (0, 1):
                minutes(session, index, T, 60, 50.0)
        with database.read() as session:
            rows = rollups.hour_rows(session, T, rollups.held(session, T, T + H), busy_pct=BUSY_PCT)

        def second() -> int:
            with database.write() as session:
                return rollups.replace(session, T, T + H, rows)

        with ThreadPoolExecutor(max_workers=1) as pool:
            with database.write() as session:
                rollups.replace(session, T, T + H, rows)
                other = pool.submit(second)
                _a_writer_waits_on_an_hour(database)
            assert 2 == other.result(timeout=60)
        assert 2 == len(stored(database))
    finally:
        database.dispose()
