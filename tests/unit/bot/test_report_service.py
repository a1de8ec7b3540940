"""Who sees which report, and what it adds up to (the shipped org: vision, nlp, platform)."""

from __future__ import annotations

import json
from datetime import UTC, timedelta

import pytest

from bot.services import Services
from bot.services.context import SYSTEM
from bot.services.reports import build, default_scope, for_everyone
from bot.services.results import Refused
from bot.slack.blocks.reports import report_message
from rules.reports import Report, Scope, ScopeKind, Window
from storage.db import Database
from storage.tables import GpuHourRow, RequestRow
from tests.builders import default_sources
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, T0, VICTOR, Clock

WEEK = Window(T0 - timedelta(days=7), T0, "last 7 days")


def hours(
    services: Services, holder: str, team: str, *, count: int, util: float, pool: str = "a100"
) -> None:
    with services.ctx.db.write() as session:
        session.add_all(
            GpuHourRow(hour=T0 - timedelta(hours=h + 1), pool=pool, node=holder, index=0,
                       team=team, holder=holder, lease_id=1, allocated_s=3600,
                       used_s=3600 * util, busy_s=3600)
            for h in range(count)
        )  # fmt: skip


@pytest.fixture
def week(services: Services) -> Services:
    hours(services, ALICE, "vision", count=4, util=0.5)  # 4 GPU-h, 2 used, $9.60
    hours(services, BOB, "vision", count=2, util=1.0, pool="l40s")  # 2 GPU-h, $2.20
    hours(services, CAROL, "nlp", count=1, util=0.25)
    return services


def report(services: Services, viewer: str, scope: Scope, **kw: object) -> Report:
    built = build(services.ctx, viewer, scope, WEEK, **kw)  # type: ignore[arg-type]
    assert isinstance(built, Report), built
    return built


def test_a_member_sees_their_own_use_by_pool(week: Services) -> None:
    mine = report(week, ALICE, Scope(ScopeKind.ME))
    assert (4.0, 2.0, 0.5) == (mine.figures.usage.allocated_h, mine.figures.usage.used_h,
                               mine.figures.usage.efficiency)  # fmt: skip
    assert pytest.approx(9.6) == mine.figures.usage.cost
    assert (["a100"], "pool", "USD", True) == ([ln.key for ln in mine.lines], mine.by,
                                               mine.currency, mine.priced)  # fmt: skip
    assert 8 == len(mine.days)
    assert 4.0 == mine.days[-1].usage.allocated_h


def test_a_member_sees_team_totals_but_not_per_person(week: Services) -> None:
    team = report(week, ALICE, Scope(ScopeKind.TEAM, "vision"))
    assert 6.0 == team.figures.usage.allocated_h
    assert "pool" == team.by  # not per person
    refused = build(week.ctx, ALICE, Scope(ScopeKind.TEAM, "vision"), WEEK, by="holder")
    assert isinstance(refused, Refused)
    assert "managers and admins" in refused.message


@pytest.mark.parametrize(
    "scope",
    [Scope(ScopeKind.TEAM, "nlp"), Scope(ScopeKind.LAB), Scope(ScopeKind.POOL, "a100"),
     Scope(ScopeKind.USER, CAROL)],
)  # fmt: skip
def test_a_member_is_told_what_they_may_see(week: Services, scope: Scope) -> None:
    refused = build(week.ctx, ALICE, scope, WEEK)
    assert isinstance(refused, Refused)
    assert "`/gpu report team vision`" in refused.message


def test_a_manager_sees_their_team_per_person(week: Services) -> None:
    team = report(week, VICTOR, Scope(ScopeKind.TEAM, "vision"))
    assert [(ALICE, 4.0), (BOB, 2.0)] == [(ln.key, ln.usage.allocated_h) for ln in team.lines]
    assert isinstance(build(week.ctx, VICTOR, Scope(ScopeKind.USER, BOB), WEEK), Report)
    assert isinstance(build(week.ctx, VICTOR, Scope(ScopeKind.TEAM, "nlp"), WEEK), Refused)


def test_admins_and_the_bot_see_everything(week: Services) -> None:
    for viewer in (ADA, SYSTEM):
        lab = report(week, viewer, Scope(ScopeKind.LAB))
        assert [("vision", 6.0), ("nlp", 1.0)] == [
            (ln.key, ln.usage.allocated_h) for ln in lab.lines
        ]
    pool = report(week, ADA, Scope(ScopeKind.POOL, "l40s"))
    assert pytest.approx(2.2) == pool.figures.usage.cost


def test_unknown_teams_and_pools_are_named(week: Services) -> None:
    refused = build(week.ctx, ADA, Scope(ScopeKind.TEAM, "visoin"), WEEK)
    assert isinstance(refused, Refused)
    assert "no team `visoin`; teams: nlp, platform, vision" in refused.message


def test_without_a_scope_admins_see_the_lab_managers_their_team_members_themselves(
    services: Services,
) -> None:
    ctx = services.ctx
    assert [Scope(ScopeKind.LAB), Scope(ScopeKind.TEAM, "vision"), Scope(ScopeKind.ME, ALICE)] == [
        default_scope(ctx, ADA),
        default_scope(ctx, VICTOR),
        default_scope(ctx, ALICE),
    ]


@pytest.mark.parametrize(
    ("viewer", "scope", "fmt", "everyone"),
    [
        (ALICE, Scope(ScopeKind.ME), "png", True),
        (ALICE, Scope(ScopeKind.ME), "csv", True),  # her own use, by pool
        (ALICE, Scope(ScopeKind.TEAM, "vision"), "csv", True),  # a member: the team by pool
        (VICTOR, Scope(ScopeKind.TEAM, "vision"), "png", True),  # the chart: totals a day
        (VICTOR, Scope(ScopeKind.TEAM, "vision"), "csv", False),  # person by person
        (VICTOR, Scope(ScopeKind.USER, ALICE), "png", False),
        (ADA, Scope(ScopeKind.LAB), "png", False),
        (ADA, Scope(ScopeKind.POOL, "a100"), "csv", False),
    ],
)
def test_only_ones_own_use_and_a_teams_totals_are_for_everyone_in_a_channel(
    week: Services, viewer: str, scope: Scope, fmt: str, everyone: bool
) -> None:
    """What a Chart or CSV click may share in the channel it came from."""
    assert everyone == for_everyone(report(week, viewer, scope), fmt)


def test_requests_still_waiting_are_counted_beside_the_waits(week: Services) -> None:
    """A request filed 3 h ago and still queued is no granted wait, but the report says so."""
    with week.ctx.db.write() as session:
        session.add(
            RequestRow(kind="borrow", requester=ALICE, team="vision", pool="a100", gpus=2,
                       duration_s=3600, state="queued", outcome="queue",
                       created_at=T0 - timedelta(hours=3))
        )  # fmt: skip
    mine = report(week, ALICE, Scope(ScopeKind.ME))
    assert (0, 1, 3 * 3600.0) == (mine.figures.granted, mine.figures.still_waiting,
                                  mine.figures.oldest_wait_s)  # fmt: skip
    said = json.dumps(report_message(mine, viewer=ALICE, window_text="", tz=UTC).blocks)
    assert "no request was granted; 1 still waiting, the oldest for 3h" in said


def test_the_cost_is_in_the_currency_the_rule_files_name(database: Database, clock: Clock) -> None:
    """`reports.currency: EUR`: the same prices, named in euros in the figures and the answer."""
    sources = default_sources()
    sources["reports.yaml"] = sources["reports.yaml"].replace("currency: USD", "currency: EUR")
    services = Services.open(database, sources, clock=clock)
    try:
        hours(services, ALICE, "vision", count=4, util=0.5)  # 4 a100 GPU-h at 2.40
        mine = report(services, ALICE, Scope(ScopeKind.ME))
        assert "EUR" == mine.currency
        assert pytest.approx(9.6) == mine.figures.usage.cost
        said = json.dumps(report_message(mine, viewer=ALICE, window_text="", tz=UTC).blocks)
        assert "9.60 EUR" in said
        assert "USD" not in said
    finally:
        services.close()
