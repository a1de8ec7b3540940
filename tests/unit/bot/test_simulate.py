"""The rules simulation on a history recorded by the real use cases, on SQLite and PostgreSQL:
the known set of differences, as table lines and as JSON lines, and the summary kept for the
reload's one line."""

from __future__ import annotations

import json
from datetime import timedelta

import sqlalchemy as sa

from bot.services import Services, simulate
from rules.loader import load_policy
from storage import replay
from storage.tables import GpuMinuteRow
from tests.builders import default_policy
from tests.unit.bot.conftest import T0, Clock
from tests.unit.bot.history import ALICE, CAROL, candidate_sources, record_history

SINCE, UNTIL = T0 - timedelta(days=1), T0 + timedelta(hours=3)


def simulated(services: Services, clock: Clock) -> simulate.Simulation:
    record_history(services, clock.advance)
    candidate = load_policy(candidate_sources())
    return simulate.simulate(services.db, default_policy(), candidate, since=SINCE, until=UNTIL)


def test_the_recorded_history_replayed_through_the_candidate_shows_the_known_differences(
    services: Services, clock: Clock
) -> None:
    """Two borrows change outcome (longer than 4h asks, 6 GPUs is denied), Alice's idle lease
    is warned 30 minutes earlier and reclaimed 10 minutes before she released it."""
    sim = simulated(services, clock)
    candidate = load_policy(candidate_sources()).revision
    assert [
        f"Simulated revision {candidate} against {default_policy().revision} in force, "
        "2026-03-01 09:00 UTC to 2026-03-02 12:00 UTC",
        "requests replayed: 3",
        "outcomes changed: 2 (approve → ask: 1, approve → deny: 1)",
        "leases replayed: 3",
        "would-have reclaims: 1 added, 0 removed",
        "warnings: 0 added, 0 removed",
        "GPU-h freed: 0.33",
        "people affected: Alice Anders, Carol Chen",
        "differences:",
        "R1 borrow of 2 a100 by Alice Anders: approve → ask managers "
        "(long-borrow-needs-a-manager: 6h is longer than 4 hours, so a manager of vision decides)",
        "R3 borrow of 6 a100 by Carol Chen: approve → deny "
        "(too-many-gpus: 6 GPUs is more than one request may take in a100 (4))",
        "L1 of Alice Anders (2 a100): warn idle earlier: at 2026-03-02 10:00 UTC instead of "
        "2026-03-02 10:30 UTC",
        "L1 of Alice Anders (2 a100): reclaim idle at 2026-03-02 10:30 UTC, only under the "
        "candidate (reclaim-idle); +0.33 GPU-h freed",
    ] == list(simulate.table(sim))


def test_each_difference_is_one_json_object_and_the_summary_comes_last(
    services: Services, clock: Clock
) -> None:
    sim = simulated(services, clock)
    objects = [json.loads(line) for line in simulate.jsonl(sim)]
    assert ["request", "request", "lease", "lease"] == [o.get("type") for o in objects[:-1]]
    assert {
        "type": "lease",
        "lease": 1,
        "person": "Alice Anders",
        "user": ALICE,
        "pool": "a100",
        "gpus": 2,
        "action": "reclaim idle",
        "change": "added",
        "in_force_at": None,
        "candidate_at": "2026-03-02T10:30:00+00:00",
        "rule": "reclaim-idle",
        "gpu_h_freed": 0.33,
    } == objects[3]
    assert ("approve → deny", CAROL) == (objects[1]["change"], objects[1]["user"])
    summary = objects[-1]["summary"]
    assert (3, 2, 1, 0, 0.33) == (
        summary["requests"],
        summary["outcomes_changed"],
        summary["reclaims_added"],
        summary["reclaims_removed"],
        summary["gpu_h_freed"],
    )
    assert ["Alice Anders", "Carol Chen"] == summary["people"]


def test_the_same_rules_show_no_differences(services: Services, clock: Clock) -> None:
    record_history(services, clock.advance)
    policy = default_policy()
    sim = simulate.simulate(services.db, policy, policy, since=SINCE, until=UNTIL)
    assert "no differences" == list(simulate.table(sim))[-1]
    assert (3, 3, 0) == (sim.summary.requests, sim.summary.leases, len(sim.summary.people))


def test_only_what_the_window_holds_is_replayed(services: Services, clock: Clock) -> None:
    """Requests made and leases ended before `since` are left out."""
    record_history(services, clock.advance)
    with services.db.read() as session:
        later = T0 + timedelta(minutes=50)  # the leases ended at 30, 60 and 100 minutes
        assert [1, 2, 3] == [a.request.id for a in replay.requests_in(session, T0, later)]
        assert [] == replay.requests_in(session, later, UNTIL)
        assert [1, 2] == [life.id for life in replay.leases_in(session, later, UNTIL)]


def test_the_summary_is_kept_for_the_reload_of_that_revision(
    services: Services, clock: Clock
) -> None:
    """`/gpu admin reload` of the simulated revision gets one line; another revision none."""
    sim = simulated(services, clock)
    assert services.simulation_note(sim.candidate) is None
    simulate.remember(services.db, sim, at=UNTIL, by="test")
    assert (
        "A simulation of this revision over the last 1 day: 2 outcomes change, 1 more reclaim, "
        "0 fewer, 0.33 GPU-h freed, 2 people affected."
    ) == services.simulation_note(sim.candidate)
    assert services.simulation_note(default_policy().revision) is None


def test_leases_without_any_stored_minute_are_named_in_the_summary(
    services: Services, clock: Clock
) -> None:
    """No telemetry was kept: the leases are unknown throughout, so no idle rule can act, and
    the summary says so rather than a bare "no differences"."""
    record_history(services, clock.advance)
    with services.db.write() as session:
        session.execute(sa.delete(GpuMinuteRow))
    candidate = load_policy(candidate_sources())
    sim = simulate.simulate(services.db, default_policy(), candidate, since=SINCE, until=UNTIL)
    lines = list(simulate.table(sim))
    assert (
        "leases replayed: 3 (3 with no stored minute of telemetry: unknown throughout, so no "
        "idle rule can act on them)"
    ) in lines
    assert 3 == json.loads(list(simulate.jsonl(sim))[-1])["summary"]["leases_unobserved"]
