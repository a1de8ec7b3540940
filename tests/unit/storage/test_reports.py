"""Sums over hourly rows, request waits and audit counts, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from rules.reports import Counts
from storage import migrate, reports
from storage.audit import AuditEntry, AuditTag, append
from storage.db import Database
from storage.reports import Filter
from storage.tables import GpuHourRow, RequestRow
from tests.unit.storage.builders import a_lease

T0 = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
PRICES = {"a100": 2.0}


def hour_row(
    hour: int,
    *,
    gpu: int = 0,
    pool: str = "a100",
    team: str = "vision",
    holder: str = "U1",
    lease: int = 1,
    util: float = 0.5,
) -> GpuHourRow:
    return GpuHourRow(
        hour=T0 + timedelta(hours=hour), pool=pool, node="n1", index=gpu, team=team,
        holder=holder, lease_id=lease, allocated_s=3600, used_s=3600 * util,
        busy_s=3600, idle_s=0, unknown_s=0, unreserved_s=0,
    )  # fmt: skip


def fill(database: Database) -> None:
    with database.write() as session:
        # Two GPUs for three hours at 50 %, for U1 of vision in a100 ...
        session.add_all([hour_row(h, gpu=g) for h in range(3) for g in (0, 1)])
        # ... one l40s hour of U2 in nlp, unpriced, and one hour of unreserved use.
        session.add(hour_row(1, pool="l40s", team="nlp", holder="U2", lease=2, util=1.0))
        session.add(GpuHourRow(hour=T0, pool="a100", node="n1", index=5, unreserved_s=1200))


def test_usage_by_team_prices_allocated_gpu_hours(database: Database) -> None:
    fill(database)
    with database.read() as session:
        by_team = reports.usage(session, T0, T0 + timedelta(hours=3), Filter(), "team",
                                prices=PRICES)  # fmt: skip
    vision, nlp, unheld = by_team["vision"], by_team["nlp"], by_team[""]
    assert (6.0, 3.0, 0.5, 12.0) == (vision.allocated_h, vision.used_h, vision.efficiency,
                                     vision.cost)  # fmt: skip
    assert (1.0, 1.0, 0.0) == (nlp.allocated_h, nlp.used_h, nlp.cost)
    assert (0.0, 1200.0) == (unheld.allocated_s, unheld.unreserved_s)


def test_usage_filters_windows_and_groups_by_local_day(database: Database) -> None:
    fill(database)
    with database.read() as session:
        mine = reports.usage(session, T0 + timedelta(hours=1), T0 + timedelta(hours=9),
                             Filter(holder="U1"), None, prices=PRICES)  # fmt: skip
        days = reports.usage(session, T0, T0 + timedelta(days=1), Filter(pool="a100"), "day",
                             prices={}, tz=UTC)  # fmt: skip
        leases = reports.usage(session, T0, T0 + timedelta(days=1), Filter(team="nlp"),
                               "lease", prices={})  # fmt: skip
    assert 4.0 == mine[""].allocated_h  # hours 1 and 2 of both GPUs
    assert {"2026-11-30": 4.0, "2026-12-01": 2.0} == {k: u.allocated_h for k, u in days.items()}
    assert ["L2"] == list(leases)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def migrated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A database built by the migrations, with the indexes only they make (SQLite's by day
    and lease)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'gpubot.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    migrate.upgrade(url)
    database = Database(url)
    yield database
    database.dispose()


def test_usage_by_lease_sums_each_lease_across_midnight(migrated: Database) -> None:
    """Lease 1 holds two GPUs 22:00 to 01:00, across midnight UTC (SQLite sums it day by day
    first); lease 2 one l40s hour; unheld use in two pools is one line, priced at nothing."""
    fill(migrated)
    with migrated.write() as session:
        session.add(GpuHourRow(hour=T0 + timedelta(hours=2), pool="l40s", node="n2", index=0,
                               unreserved_s=600))  # fmt: skip
    with migrated.read() as session:
        whole = reports.usage(session, T0, T0 + timedelta(hours=3), Filter(), "lease",
                              prices=PRICES)  # fmt: skip
        middle = reports.usage(session, T0 + timedelta(hours=1), T0 + timedelta(hours=2),
                               Filter(), "lease", prices=PRICES)  # fmt: skip
    one, two, unheld = whole["L1"], whole["L2"], whole[""]
    assert (6.0, 3.0, 0.5, 12.0) == (one.allocated_h, one.used_h, one.efficiency, one.cost)
    assert (1.0, 1.0, 0.0) == (two.allocated_h, two.used_h, two.cost)
    assert (0.0, 1800.0, 0.0) == (unheld.allocated_s, unheld.unreserved_s, unheld.cost)
    assert {"L1": 2.0, "L2": 1.0} == {k: u.allocated_h for k, u in middle.items()}


def test_sqlite_reads_a_breakdown_by_lease_from_the_index_by_day(tmp_path: Path) -> None:
    """The statement spells the day as migration 0017's index does, so SQLite reads the rows
    from it in lease order rather than sorting them."""
    url = f"sqlite:///{tmp_path / 'gpubot.db'}"
    migrate.upgrade(url)
    database = Database(url)
    seen: list[tuple[str, Any]] = []

    def record(*args: Any) -> None:
        seen.append((args[2], args[3]))

    try:
        with database.read() as session:
            sa.event.listen(session.get_bind(), "before_cursor_execute", record)
            try:
                reports.usage(session, T0, T0 + timedelta(days=1), Filter(), "lease", prices={})
            finally:
                sa.event.remove(session.get_bind(), "before_cursor_execute", record)
            statement, parameters = next((s, p) for s, p in seen if "gpu_hour" in s)
            plan = session.connection().exec_driver_sql(
                f"EXPLAIN QUERY PLAN {statement}", parameters
            )
            details = " ".join(str(row[-1]) for row in plan)
    finally:
        database.dispose()
    assert "ix_gpu_hour_lease_day" in details


def request(
    session: Session,
    *,
    filed: datetime,
    lease_id: int | None,
    team: str = "vision",
    requester: str = "U1",
    state: str = "approved",
) -> None:
    session.add(RequestRow(
        kind="borrow", requester=requester, team=team, pool="a100", gpus=1, duration_s=3600,
        state=state, outcome="approve", lease_id=lease_id, created_at=filed,
    ))  # fmt: skip


def test_waits_run_from_filing_to_grant(database: Database) -> None:
    with database.write() as session:
        for minutes in (0, 10, 30):
            lease = a_lease(session, at=T0 + timedelta(minutes=minutes))
            request(session, filed=T0, lease_id=lease)
        request(session, filed=T0, lease_id=None)  # still waiting: no grant to count
        other = a_lease(session, at=T0 + timedelta(hours=2), team="nlp", holder="U2")
        request(session, filed=T0, lease_id=other, team="nlp", requester="U2")
    with database.read() as session:
        vision = reports.waits(session, T0, T0 + timedelta(days=1), Filter(team="vision"))
        everyone = reports.waits(session, T0, T0 + timedelta(days=1), Filter())
    assert [0.0, 600.0, 1800.0] == sorted(vision)
    assert 4 == len(everyone)


def test_requests_still_waiting_are_counted_with_the_oldest_wait(database: Database) -> None:
    """Filed 22:00 and 22:30 and still queued or with a manager at 23:30: two waiting, the
    oldest 90 minutes; a denied one, one filed before the window and another team's are not."""
    with database.write() as session:
        request(session, filed=T0, lease_id=None, state="queued")
        request(session, filed=T0 + timedelta(minutes=30), lease_id=None, state="pending")
        request(session, filed=T0 + timedelta(minutes=5), lease_id=None, state="denied")
        request(session, filed=T0 - timedelta(hours=1), lease_id=None, state="queued")
        request(session, filed=T0, lease_id=None, state="queued", team="nlp", requester="U2")
    now = T0 + timedelta(minutes=90)
    with database.read() as session:
        vision = reports.still_waiting(session, T0, now, Filter(team="vision"), now=now)
        none = reports.still_waiting(session, now, now, Filter(), now=now)
    assert ((2, 5400.0), (0, None)) == (vision, none)


def test_counts_come_from_audit_tags_of_the_scope_s_leases(database: Database) -> None:
    with database.write() as session:
        mine = a_lease(session, at=T0, holder="U1")
        theirs = a_lease(session, at=T0, holder="U2", team="nlp")
    entries = [
        (AuditTag.SWEEP_RECLAIM, mine), (AuditTag.LEASE_EXTENDED, mine),
        (AuditTag.LEASE_EXTENDED, theirs), (AuditTag.LEASE_RECALLED, theirs),
        (AuditTag.LEASE_GRANTED, mine),
    ]  # fmt: skip
    with database.write() as session:
        for tag, lease in entries:
            entry = AuditEntry(actor="gpubot", tag=tag, subject=f"lease:{lease}")
            append(session, entry, at=T0 + timedelta(minutes=5))
    with database.read() as session:
        until = T0 + timedelta(hours=1)
        assert Counts(1, 1, 0) == reports.counts(session, T0, until, Filter(holder="U1"))
        assert Counts(1, 2, 1) == reports.counts(session, T0, until, Filter())
        assert Counts() == reports.counts(session, until, until + timedelta(hours=1), Filter())


def test_a_reclaim_counts_once_though_the_sweep_and_the_lease_end_both_record_it(
    database: Database,
) -> None:
    """The sweep writes `sweep:reclaim`, then the lease's end `lease:reclaimed`: one reclaim."""
    with database.write() as session:
        lease = a_lease(session, at=T0)
        for tag in (AuditTag.SWEEP_RECLAIM, AuditTag.LEASE_RECLAIMED):
            entry = AuditEntry(actor="gpubot", tag=tag, subject=f"lease:{lease}")
            append(session, entry, at=T0 + timedelta(minutes=5))
    with database.read() as session:
        found = reports.counts(session, T0, T0 + timedelta(hours=1), Filter())
    assert Counts(1, 0, 0) == found


def test_counts_for_a_scope_bind_the_same_few_values_however_many_leases(
    database: Database,
) -> None:
    """A busy year's audit rows are matched to their leases by the database: 60 extended
    leases, 20 of them U1's, and the statement binds no value per lease."""
    with database.write() as session:
        ids = [a_lease(session, at=T0, holder="U1" if n % 3 == 0 else "U2") for n in range(60)]
        for lease in ids:
            entry = AuditEntry(
                actor="gpubot", tag=AuditTag.LEASE_EXTENDED, subject=f"lease:{lease}"
            )
            append(session, entry, at=T0 + timedelta(minutes=5))
    bound: list[int] = []

    def count(*args: Any) -> None:
        parameters = args[3]
        bound.append(len(parameters) if isinstance(parameters, dict | list | tuple) else 0)

    with database.read() as session:
        sa.event.listen(session.get_bind(), "before_cursor_execute", count)
        try:
            found = reports.counts(session, T0, T0 + timedelta(hours=1), Filter(holder="U1"))
        finally:
            sa.event.remove(session.get_bind(), "before_cursor_execute", count)
    assert Counts(0, 20, 0) == found
    assert max(bound) < 10
