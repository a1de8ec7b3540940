"""The demo's seeded past: two weeks of ended leases, their requests and hourly GPU use,
marked as demo data, consistent with each other, the same every time, on SQLite and
PostgreSQL."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from sqlmodel import select

from bot.services import Services, reports, rollups
from bot.workspace import history
from bot.workspace.history import ADA, ALICE, BOB, MARK, PLAN, QUIET, VICTOR, cycle, idle
from rules.reports import Counts, Report, Scope, ScopeKind, parse_window
from storage import audit
from storage.db import Database
from storage.tables import AuditRow, GpuHourRow, LeaseGpuRow, LeaseRow, RequestRow
from tests.builders import default_sources
from tests.support.copies import Built

START = datetime(2026, 3, 16, 9, 25, tzinfo=UTC)  # the demo starts; its hour is 09:00
HOUR0 = datetime(2026, 3, 16, 9, 0, tzinfo=UTC)
WEEK_AGO = HOUR0 - timedelta(days=7)


@pytest.fixture(scope="module")
def built_seeded(database_to_build: Built) -> Built:
    """The seeded past, written once per module and engine."""
    services = Services.open(database_to_build.db, default_sources(), clock=lambda: START)
    assert len(PLAN) == history.seed(services.ctx.db, services.policy, START)
    services.close()
    database_to_build.freeze()
    return database_to_build


@pytest.fixture
def seeded(built_seeded: Built) -> Iterator[Services]:
    """The seeded past, on this test's own copy of its database."""
    with built_seeded.copy() as database:
        services = Services.open(database, default_sources(), clock=lambda: START)
        yield services
        services.close()


def test_every_seeded_lease_request_and_audit_row_says_it_is_demo_data(
    seeded: Services,
) -> None:
    with seeded.ctx.db.read() as session:
        leases = session.exec(select(LeaseRow)).all()
        requests = session.exec(select(RequestRow)).all()
        rows = session.exec(select(AuditRow)).all()
        chain = audit.verify(session)
    assert len(PLAN) == len(leases)
    assert all(lease.reason.startswith(MARK) for lease in leases)
    assert all(request.reason.startswith(MARK) for request in requests)
    seeded_rows = [row for row in rows if row.detail.get("seeded") == MARK]
    assert {"lease:granted", "lease:released", "lease:reclaimed"} <= {r.tag for r in seeded_rows}
    assert chain.ok  # the seeded rows are links of the one hash chain
    assert all(request.audit_id is not None for request in requests)


def test_the_past_ends_before_the_demo_starts_and_no_gpu_is_held_twice(seeded: Services) -> None:
    """Leases and hours end `QUIET` before the start hour (the rollup's own hours), one lease
    per GPU at a time, and their GPUs are free."""
    with seeded.ctx.db.read() as session:
        leases = session.exec(select(LeaseRow)).all()
        held = session.exec(select(LeaseGpuRow)).all()
        last = max(hour.hour for hour in session.exec(select(GpuHourRow)).all())
    assert all(lease.ended_at and lease.ended_at <= HOUR0 - QUIET for lease in leases)
    assert last + timedelta(hours=1) <= HOUR0 - QUIET
    assert all(lease.granted_at >= HOUR0 - timedelta(days=14) for lease in leases)
    assert not any(row.active for row in held)
    by_gpu: dict[tuple[str, int], list[tuple[datetime, datetime]]] = defaultdict(list)
    for past, lease in zip(PLAN, sorted(leases, key=lambda row: row.id or 0), strict=True):
        assert lease.ended_at is not None
        for slot in past.slots():
            by_gpu[slot].append((lease.granted_at, lease.ended_at))
    for spans in by_gpu.values():
        spans.sort()
        assert all(end <= after for (_, end), (after, _) in pairwise(spans))


def test_no_lease_or_request_sits_on_the_hour_a_week_before_the_start(seeded: Services) -> None:
    """A 7-day window starts somewhere in that hour: what is seeded lies wholly on one side."""
    edge = (WEEK_AGO - timedelta(hours=1), WEEK_AGO + timedelta(hours=2))
    with seeded.ctx.db.read() as session:
        leases = session.exec(select(LeaseRow)).all()
        requests = session.exec(select(RequestRow)).all()
    for lease in leases:
        assert lease.ended_at is not None
        assert lease.ended_at <= WEEK_AGO or lease.granted_at >= edge[1] - timedelta(hours=1)
    assert not [r.id for r in requests if edge[0] < r.created_at < edge[1]]


def test_each_leases_hours_add_up_to_its_gpus_times_its_length(seeded: Services) -> None:
    """allocated = busy + idle + unknown, hour by hour; a lease's hours cover it exactly."""
    with seeded.ctx.db.read() as session:
        leases = {lease.id: lease for lease in session.exec(select(LeaseRow)).all()}
        hours = session.exec(select(GpuHourRow)).all()
    allocated: dict[int, float] = defaultdict(float)
    for hour in hours:
        assert hour.allocated_s == hour.busy_s + hour.idle_s + hour.unknown_s
        if hour.lease_id:
            allocated[hour.lease_id] += hour.allocated_s
            lease = leases[hour.lease_id]
            assert (hour.team, hour.holder, hour.pool) == (lease.team, lease.holder, lease.pool)
        else:
            assert (0.0, "", "") == (hour.allocated_s, hour.team, hour.holder)
            assert 3600.0 == hour.unreserved_s
    for lease in leases.values():
        assert lease.id is not None
        assert lease.ended_at is not None
        length = (lease.ended_at - lease.granted_at).total_seconds()
        assert lease.gpus * length == allocated[lease.id]


def test_the_same_start_seeds_the_same_past(database: Database) -> None:
    policy = Services.open(database, default_sources(), clock=lambda: START).policy
    first = history.history(START, policy)
    assert first == history.history(START.replace(minute=59), policy)
    assert first != history.history(START + timedelta(hours=1), policy)


def test_cycle_repeats_its_runs_and_cuts_the_last_one_short() -> None:
    assert (idle(2), idle(1, 5), idle(2), idle(1, 5), idle(1)) == cycle(7, idle(2), idle(1, 5))


def a_report(services: Services, viewer: str, scope: Scope) -> Report:
    report = reports.build(services.ctx, viewer, scope, parse_window("7d", START, UTC))
    assert isinstance(report, Report), report
    return report


def test_victors_week_of_vision_is_what_the_plan_adds_up_to(seeded: Services) -> None:
    """Vision's last seven days, lease by lease (GPUs x hours; used = busy hours x util):
    alice 4x10 (32 h busy at 95 %, 8 idle), 6x32 (168 at 90 %, 24 unknown), 8x8 (64 at 92 %),
    4x6 (24 at 85 %, recalled), l40s 2x12 (24 at 80 %); bob 2x6 (4 at 60 %, 8 idle),
    2x5 (6 at 70 %, 4 idle), l40s 1x8 (8 idle)."""
    report = a_report(seeded, VICTOR, Scope(ScopeKind.TEAM, "vision"))
    usage = report.figures.usage
    assert 40 + 192 + 64 + 24 + 24 + 12 + 10 + 8 == 374 == pytest.approx(usage.allocated_h)
    used = 32 * 0.95 + 168 * 0.9 + 64 * 0.92 + 24 * 0.85 + 24 * 0.8 + 4 * 0.6 + 6 * 0.7
    assert 286.68 == pytest.approx(used) == pytest.approx(usage.used_h)
    assert (28, 24, 0) == pytest.approx((usage.idle_h, usage.unknown_h, usage.unreserved_h))
    assert 0.7665 == pytest.approx(usage.efficiency, abs=5e-5)
    assert 342 * 2.40 + 32 * 1.10 == pytest.approx(856.0) == pytest.approx(usage.cost)
    assert "holder" == report.by
    per_person = {line.key: line.usage for line in report.lines}
    assert [ALICE, BOB] == list(per_person)  # the biggest first
    assert (344, 280.08) == pytest.approx((per_person[ALICE].allocated_h, per_person[ALICE].used_h))
    assert (30, 6.6) == pytest.approx((per_person[BOB].allocated_h, per_person[BOB].used_h))
    # waits, minutes: 0 for the five approved at once, 25 and 40 for Victor, 90 queued
    assert 8 == report.figures.granted
    assert 0 == report.figures.wait_p50_s
    assert (40 + 0.3 * (90 - 40)) * 60 == pytest.approx(report.figures.wait_p90_s)
    # bob's two notebooks, alice's expired pretraining and her recalled borrow; one extension
    assert Counts(reclaims=4, extensions=1, recalls=1) == report.figures.counts
    assert 374 == pytest.approx(sum(day.usage.allocated_h for day in report.days))


def test_alice_sees_her_teams_week_by_pool_not_by_person(seeded: Services) -> None:
    report = a_report(seeded, ALICE, Scope(ScopeKind.TEAM, "vision"))
    assert {"a100": 342, "l40s": 32} == {
        line.key: pytest.approx(line.usage.allocated_h) for line in report.lines
    }


def test_the_labs_week_adds_every_team_and_the_use_without_a_lease(seeded: Services) -> None:
    """vision 374; nlp 328 (carol 2x48 and 4x20 on a100, 1x10 on l40s; dave 2x6, 1x10 and
    4x30); platform 676 (serving 4x161, 1x8 and 2x12 on l40s); 3 + 2 + 4 hours unleased."""
    report = a_report(seeded, ADA, Scope(ScopeKind.LAB))
    usage = report.figures.usage
    assert {"vision": 374, "nlp": 328, "platform": 676} == {
        line.key: pytest.approx(line.usage.allocated_h) for line in report.lines if line.key
    }
    assert (1378, 260, 28, 9) == pytest.approx(
        (usage.allocated_h, usage.idle_h, usage.unknown_h, usage.unreserved_h)
    )
    # serving: 448 busy GPU-h at 42 % and 196 quiet at 1 %; the rest as the plan says
    serving = 448 * 0.42 + 196 * 0.01
    assert 190.12 == pytest.approx(serving)
    assert 753.78 == pytest.approx(usage.used_h)
    assert (342 + 318) * 2.40 + 74 * 1.10 + 644 * 3.90 == pytest.approx(usage.cost)
    # 17 grants: nine at once, then 5, 10, 15, 20, 25, 40, 90 and 120 minutes
    assert (17, 0) == (report.figures.granted, report.figures.wait_p50_s)
    assert (40 + 0.4 * 50) * 60 == pytest.approx(report.figures.wait_p90_s)
    assert Counts(reclaims=4, extensions=2, recalls=1) == report.figures.counts


def test_the_hourly_rollup_leaves_the_seeded_hours_as_they_are(seeded: Services) -> None:
    """The rollup starts at the start hour (and rolls the two hours before it again, which the
    past leaves empty): the made-up busy and idle hours are never rolled again as unknown."""

    def stored() -> list[tuple[object, ...]]:
        with seeded.ctx.db.read() as session:
            rows = session.exec(select(GpuHourRow)).all()
        return sorted((r.hour, r.node, r.index, r.lease_id, r.used_s, r.idle_s) for r in rows)

    before = stored()
    rollups.run(seeded.ctx, HOUR0 + timedelta(hours=2))
    assert before == stored()
