"""The observe-mode report over real sweeps (SQLite and PostgreSQL): what an observe-only rule
would have done, and how often the lease was busy again within the hour after a would-have
reclaim; unknown telemetry afterwards is counted apart, never as idle."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from bot.services import BorrowAsk, Services
from bot.services.observed import as_json, observed, render
from rules.domain import Outcome
from rules.observed import Tally
from storage.db import Database
from tests.unit.bot.conftest import BOB, T0, Clock, borrowed
from tests.unit.bot.observing import observing_sources, three_idle_leases


@pytest.fixture
def observing(database: Database, clock: Clock) -> Iterator[Services]:
    svc = Services.open(database, observing_sources(), clock=clock)
    yield svc
    svc.close()


def test_a_would_have_reclaim_busy_again_within_the_hour_counts_against_the_rule(
    observing: Services, clock: Clock
) -> None:
    """Three would-have reclaims at 09:31: one lease busy again at 09:51, one idle to 10:31,
    one silent after: busy again after 1 of the 2 that can be told (50 %), 1 left out."""
    three_idle_leases(observing, clock)
    report = observed(observing.ctx, T0, clock.now)
    rule = next(r for r in report.rules if r.rule == "reclaim-idle-fast")
    assert ("lease", "observe") == (rule.subject, rule.state)
    assert ((("reclaim idle", 3),), 3) == (rule.verdicts, rule.affected)
    assert Tally(busy=1, idle=1, unknown=1, pending=0) == rule.reclaims
    assert 0.5 == rule.reclaims.false_positive_rate
    text = render(report)
    assert (
        "  busy again within 1h after 1 of 2 would-have reclaims (50 %); "
        "1 left out: no telemetry for part of the 1h after"
    ) in text.splitlines()
    assert "reclaim-idle-fast (lease rule, observe mode)" in text.splitlines()


def test_a_would_have_reclaim_younger_than_the_hour_is_too_recent_to_tell(
    observing: Services, clock: Clock
) -> None:
    """At 09:45 the hour after 09:31 has not passed: the idle leases are too recent to tell,
    the one already busy again counts."""
    three_idle_leases(observing, clock, until=timedelta(minutes=55))
    report = observed(observing.ctx, T0, clock.now)
    rule = next(r for r in report.rules if r.rule == "reclaim-idle-fast")
    assert Tally(busy=1, idle=0, unknown=0, pending=2) == rule.reclaims
    assert (
        "  busy again within 1h after 1 of 1 would-have reclaim (100 %); 2 too recent to tell"
    ) in render(report).splitlines()


def test_an_observed_request_rule_counts_what_it_would_have_asked_and_what_applied(
    observing: Services,
) -> None:
    """The shipped big-request-without-reason: Bob's 4 GPUs without a reason would have been
    asked about; the 2 with a reason and a second decision row are not counted again."""
    result = borrowed(observing, BOB, BorrowAsk("a100", 4, timedelta(hours=2)))
    borrowed(observing, BOB, BorrowAsk("a100", 2, timedelta(hours=2)))
    report = observed(observing.ctx, T0, T0 + timedelta(hours=1))
    rule = next(r for r in report.rules if r.rule == "big-request-without-reason")
    assert ("request", "observe") == (rule.subject, rule.state)
    assert ((("ask managers", 1),), 1) == (rule.verdicts, rule.affected)
    assert ((str(result.outcome), 1),) == rule.actual
    assert Outcome.APPROVE == result.outcome
    (line,) = [j for j in as_json(report) if j["rule"] == "big-request-without-reason"]
    assert {"ask managers": 1} == line["would_have"]
    idle_rule = next(r for r in report.rules if r.rule == "reclaim-idle-fast")
    assert "  would have done nothing in this window" in render(report).splitlines()
    assert () == idle_rule.verdicts


def test_a_rule_taken_out_of_the_files_still_shows_what_it_would_have_done(
    observing: Services, clock: Clock
) -> None:
    """After a reload without the observe rule its would-haves are marked so."""
    three_idle_leases(observing, clock, until=timedelta(minutes=32))
    sources = observing_sources()
    sources["sweep.yaml"] = sources["sweep.yaml"].split("\n  - id: reclaim-idle-fast")[0] + "\n"
    observing.reload_rules("U0ADMIN01", sources)
    report = observed(observing.ctx, T0, clock.now)
    (gone,) = [r for r in report.rules if r.state == "gone"]
    assert ("reclaim-idle-fast", "lease", 3) == (gone.rule, gone.subject, gone.affected)
    assert "reclaim-idle-fast (lease rule, no longer in the rules)" in render(report)


def test_the_look_ahead_is_the_reports_setting(database: Database, clock: Clock) -> None:
    """`busy_again_within: 10m`: the lease busy again 20 minutes after no longer counts."""
    sources = observing_sources()
    sources["reports.yaml"] = sources["reports.yaml"].replace(
        "busy_again_within: 1h", "busy_again_within: 10m"
    )
    services = Services.open(database, sources, clock=clock)
    try:
        three_idle_leases(services, clock)
        report = observed(services.ctx, T0, clock.now)
    finally:
        services.close()
    rule = next(r for r in report.rules if r.rule == "reclaim-idle-fast")
    assert (timedelta(minutes=10), Tally(busy=0, idle=2, unknown=1)) == (
        report.within,
        rule.reclaims,
    )


def test_an_observed_gpu_rule_says_its_would_haves_are_not_recorded(
    database: Database, clock: Clock
) -> None:
    """The sweep acts on GPU rules' actions only: the report says so rather than "nothing"."""
    sources = observing_sources()
    sources["sweep.yaml"] += (
        "\n  - id: watch-hot\n    on: gpu\n    when: gpu.unreserved\n    then: notify unreserved"
        '\n    mode: observe\n    because: "hot"\n'
    )
    services = Services.open(database, sources, clock=clock)
    try:
        report = observed(services.ctx, T0, clock.now + timedelta(hours=1))
    finally:
        services.close()
    assert (
        "watch-hot (gpu rule, observe mode)\n"
        "  the sweep records no would-have for a GPU rule, so there is nothing to count"
    ) in render(report)
