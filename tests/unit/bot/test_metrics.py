"""/metrics after a scripted timeline: every figure parsed from the exposition text equals what
the database holds, read here the long way (rows, not grouped SQL); no label names a person;
the shipped alert rules and dashboard name only metrics that exist."""

from __future__ import annotations

import copy
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import sqlalchemy as sa
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import col, select

from bot.metrics import (
    DECISION_SECONDS,
    SETTLE,
    DatabaseCollector,
    History,
    allowed,
    build_registry,
    scrape,
    store_checkpoint,
)
from bot.metrics_text import ManySamples
from bot.services import BorrowAsk, Services
from bot.services.results import BorrowResult, SettleResult
from bot.telemetry.model import ProcessInfo, Sample
from bot.telemetry.window import TelemetryWindow
from rules.domain import GpuState
from storage import history as backfill
from storage import keyvalue, outbox
from storage.gpus import Place
from storage.tables import (
    AuditRow,
    GpuRow,
    InboxRow,
    LeaseGpuRow,
    LeaseRow,
    MetricsCheckpointRow,
    NodeRow,
    OutboxRow,
    RequestRow,
    SettingRow,
)
from tests.builders import default_sources
from tests.support.copies import Built
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, ERIN, NADIA, VICTOR, Clock

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
PEOPLE = {ALICE, BOB, CAROL, ERIN, NADIA, VICTOR, ADA, "dave"}
LABELS = {"pool", "team", "node", "state", "reason", "outcome", "kind", "reporting"}
Figures = dict[tuple[str, frozenset[tuple[str, str]]], float]


def figures(services: Services) -> Figures:
    """Every sample of one scrape: (sample name, labels) -> value."""
    text = scrape(build_registry(services, health=lambda: {"ok": True})).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def family(found: Figures, name: str) -> dict[tuple[str, ...], float]:
    """The samples called `name`, keyed by their label values in label-name order."""
    return {
        tuple(v for _, v in sorted(labels)): value
        for (sample, labels), value in found.items()
        if sample == name
    }


def a_reading(node: str, index: int, at: datetime, *, user: str | None = None) -> Sample:
    """One L40S reading: idle and empty, or with `user`'s process on it."""
    processes = (ProcessInfo(pid=7000 + index, user=user, used_mib=9000),) if user else ()
    return Sample(
        node=node,
        index=index,
        uuid=f"GPU-{node}-{index}",
        model="NVIDIA L40S",
        memory_total_mib=46068,
        memory_used_mib=9000 if user else 0,
        util_pct=60.0 if user else 0.0,
        temperature_c=41.0,
        power_w=80.0,
        health="ok",
        processes=processes,
        taken_at=at,
    )


def delivered(services: Services, clock: Clock) -> None:
    """Every message owed so far reached Slack."""
    with services.db.write() as session:
        for row in session.exec(select(OutboxRow)).all():
            if row.delivered_at is None:
                outbox.delivered(session, row.id or 0, at=clock.now, channel="D0", ts="1.0")


def asked(services: Services, user: str, ask: BorrowAsk) -> BorrowResult:
    result = services.borrow(user, ask)
    assert isinstance(result, BorrowResult), result
    return result


def approved(services: Services, manager: str, request_id: int) -> SettleResult:
    settled = services.approve(manager, request_id)
    assert isinstance(settled, SettleResult), settled
    return settled


class Morning(NamedTuple):
    """The timeline, built once per module and engine: its database, the clock at its end,
    and what the collector scraped all along it holds."""

    built: Built
    now: datetime
    history: History


def the_morning(services: Services, clock: Clock, watching: CollectorRegistry) -> None:
    """A morning: grants within nominal, three asks, an expired lease reclaimed after its
    warning, a borrow beyond nominal, a queued request, a release, a drained node, a GPU in
    use without a lease, l40s telemetry two minutes old, and automation paused; `watching`
    is scraped after each step."""
    scrape(watching)
    alice_a100 = asked(services, ALICE, BorrowAsk("a100", 2, timedelta(hours=6)))
    asked(services, ERIN, BorrowAsk("l40s", 1, timedelta(hours=1)))
    bob = asked(services, BOB, BorrowAsk("a100", 8))  # beyond vision's nominal: asks
    asked(services, CAROL, BorrowAsk("l40s", 3))
    alice_l40s = asked(services, ALICE, BorrowAsk("l40s", 4))
    carol_more = asked(services, CAROL, BorrowAsk("l40s", 2))
    scrape(watching)
    window = TelemetryWindow(timedelta(minutes=3))
    for _ in range(8):  # Erin's lease expires, is warned, and is reclaimed after the grace
        clock.advance(timedelta(minutes=15))
        services.sweep(window)
        delivered(services, clock)
        scrape(watching)
    approved(services, VICTOR, bob.request.id)
    approved(services, VICTOR, alice_l40s.request.id)
    assert "queued" == approved(services, NADIA, carol_more.request.id).request.state
    assert alice_a100.lease is not None
    scrape(watching)
    services.release(ALICE, alice_a100.lease.id)
    scrape(watching)
    assert isinstance(services.drain(ADA, "infer-node-01"), str)
    free = next(g for g in services.fleet_lines() if g.pool == "l40s" and g.place == Place.FREE)
    samples = [
        a_reading(
            node,
            index,
            clock.now,
            user="dave" if (node, index) == (free.node, free.index) else None,
        )
        for node in ("l40s-node-01", "l40s-node-02")
        for index in range(4)
    ]
    window.observe(samples, clock.now)
    services.observe_fleet(window, clock.now)
    clock.advance(timedelta(minutes=2))
    assert isinstance(services.pause(ADA), str)
    clock.advance(timedelta(minutes=3))


def watched(services: Services) -> tuple[CollectorRegistry, DatabaseCollector]:
    """A registry taking every id in at once (no settling), and its collector."""
    registry = CollectorRegistry(auto_describe=False)
    collector = DatabaseCollector(services, settle=timedelta(0))
    registry.register(collector)
    return registry, collector


@pytest.fixture(scope="module")
def morning(database_to_build: Built) -> Morning:
    clock = Clock()
    services = Services.open(database_to_build.db, default_sources(), clock=clock)
    registry, collector = watched(services)
    the_morning(services, clock, registry)
    services.close()
    database_to_build.freeze()
    return Morning(database_to_build, clock.now, collector.history)


@pytest.fixture
def timeline(morning: Morning, clock: Clock) -> Iterator[Services]:
    """The morning on this test's own copy of its database, the clock at its end."""
    clock.now = morning.now
    with morning.built.copy() as database:
        services = Services.open(database, default_sources(), clock=clock)
        yield services
        services.close()


@pytest.fixture
def watching(morning: Morning, timeline: Services) -> CollectorRegistry:
    """A registry scraped all along the timeline, taking every id in at once (no settling):
    its counters are kept up to date range by range (what it held at the morning's end)."""
    registry, collector = watched(timeline)
    collector.history.base = copy.deepcopy(morning.history.base)
    collector.history.gpu_s_shown = dict(morning.history.gpu_s_shown)
    return registry


def test_counting_as_it_goes_equals_counting_at_once(
    timeline: Services, watching: CollectorRegistry
) -> None:
    """The registry scraped all along (each scrape reading only the ids written since, and
    the leases that ended) tells what a fresh one reading the whole history tells."""
    along = {
        key: value
        for family in text_string_to_metric_families(scrape(watching).decode())
        for s in family.samples
        for key, value in [((s.name, frozenset(s.labels.items())), s.value)]
    }
    fresh = figures(timeline)
    assert {k: fresh[k] for k in along} == pytest.approx(along)
    assert {"gpubot_requests_total", "gpubot_reclaims_total"} <= {name for name, _ in along}


HISTORY = {"gpubot_requests_total", "gpubot_reclaims_total", "gpubot_lease_gpu_seconds_total"}


def history(found: Figures) -> Figures:
    return {key: value for key, value in found.items() if key[0] in HISTORY}


def test_a_replica_starting_from_the_leaders_checkpoint_tells_the_same(
    timeline: Services, clock: Clock
) -> None:
    """The leader takes its checkpoint on twice (before the timeline's reclaim, then past it,
    never back); a fresh collector then starts from it and adds what came after: the same
    counters as one counting the whole history."""
    whole = figures(timeline)  # no checkpoint yet: the whole history, once
    early = store_checkpoint(timeline.db, clock.now, settle=timedelta(minutes=60))
    later = store_checkpoint(timeline.db, clock.now, settle=timedelta(minutes=30))
    back = store_checkpoint(timeline.db, clock.now, settle=timedelta(minutes=45))
    with timeline.db.read() as session:
        stored = session.get(MetricsCheckpointRow, 1)
        assert stored is not None
        upto, totals = stored.upto, stored.totals
    assert (True, True, False) == (early, later, back)
    assert clock.now - timedelta(minutes=30) == upto
    assert [["l40s", "platform", "expired", 1]] == totals["reclaims"]  # Erin's, before `upto`
    assert history(whole) == pytest.approx(history(figures(timeline)))


def test_a_fresh_collector_reads_the_checkpoint_not_the_whole_history(
    timeline: Services, clock: Clock
) -> None:
    """What the stored checkpoint says shows through: the first scrape adds to it only the
    rows after it."""
    whole = family(figures(timeline), "gpubot_requests_total")
    assert store_checkpoint(timeline.db, clock.now)
    with timeline.db.write() as session:
        stored = session.get(MetricsCheckpointRow, 1)
        assert stored is not None
        first, *rest = stored.totals["requests"]
        stored.totals = {**stored.totals, "requests": [[*first[:4], first[4] + 5], *rest]}
        session.add(stored)
    bumped = family(figures(timeline), "gpubot_requests_total")
    key = (first[2], first[3], first[0], first[1])  # kind, outcome, pool, team
    assert whole[key] + 5 == bumped[key]
    assert {k: v for k, v in whole.items() if k != key} == {
        k: v for k, v in bumped.items() if k != key
    }


def the_long_way(services: Services, now: datetime) -> dict[str, dict[tuple[str, ...], float]]:
    """The history counters and the GPUs each team holds, counted from the rows one by one,
    keyed as `family` keys the scraped samples."""
    with services.db.read() as session:
        leases = session.exec(select(LeaseRow)).all()
        requests = session.exec(select(RequestRow)).all()
        held_gpus = session.exec(select(LeaseGpuRow, LeaseRow).join(LeaseRow)).all()
    seconds: dict[tuple[str, ...], float] = {}
    used: Counter[tuple[str, ...]] = Counter()
    for held, lease in held_gpus:
        if lease.state == "active" or lease.ended_at is not None:
            end = held.released_at or lease.ended_at or now
            key = (lease.pool, lease.team)
            seconds[key] = seconds.get(key, 0.0) + (end - lease.granted_at).total_seconds()
        used[lease.pool, lease.team] += held.active and lease.state == "active"
    return {
        "gpubot_requests_total": dict(
            Counter((r.kind, r.outcome, r.pool, r.team) for r in requests)
        ),
        "gpubot_reclaims_total": dict(
            Counter((x.pool, x.end_reason, x.team) for x in leases if x.state == "reclaimed")
        ),
        "gpubot_lease_gpu_seconds_total": seconds,
        "gpubot_quota_used_gpus": {key: n for key, n in used.items() if n},
    }


def scraped(registry: CollectorRegistry) -> dict[str, dict[tuple[str, ...], float]]:
    """What one scrape of `registry` says of the families `the_long_way` counts."""
    text = scrape(registry).decode()
    found = {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    out = {name: family(found, name) for name in HISTORY}
    out["gpubot_quota_used_gpus"] = {
        key: n for key, n in family(found, "gpubot_quota_used_gpus").items() if n
    }
    return out


def a_collector(services: Services, settle: timedelta = SETTLE) -> CollectorRegistry:
    """A registry as a process that just started serves it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(services, settle=settle))
    return registry


def a_past_lease(ended: datetime) -> backfill.PastLease:
    """An idle-reclaimed lease of one L40S that ended at `ended`, and the borrow that got it,
    as the demo's history writer backfills them."""
    granted = ended - timedelta(hours=2)
    asked = backfill.PastRequest(
        kind="borrow",
        gpus=1,
        duration_s=4 * 3600,
        outcome="approve",
        deciding_rule="within-nominal",
        created_at=granted,
        decided_at=granted,
        decided_by="gpubot",
    )
    return backfill.PastLease(
        holder=ALICE,
        team="vision",
        pool="l40s",
        gpus=(("l40s-node-02", 3),),
        reason="backfilled",
        granted_at=granted,
        expires_at=granted + timedelta(hours=4),
        ended_at=ended,
        state="reclaimed",
        end_reason="idle",
        borrow=asked,
    )


def backfilled(services: Services, lease: backfill.PastLease) -> None:
    with services.db.write() as session:
        backfill.write(session, [lease], [], mark="test")


def same(expected: dict[str, dict[tuple[str, ...], float]], found: dict[str, Any]) -> None:
    for name, values in expected.items():
        assert values == pytest.approx(found[name]), name


def test_history_written_late_with_earlier_times_is_counted(
    timeline: Services, clock: Clock, watching: CollectorRegistry
) -> None:
    """A lease and its request written after the counters moved past their times (history
    backfilled in bulk) count in the collector that watched all along, in a restarted one
    starting from the leader's checkpoint, in the checkpoint the leader takes next, and in one
    counting the whole history."""
    assert store_checkpoint(timeline.db, clock.now)
    scrape(watching)
    restarted = a_collector(timeline)
    scrape(restarted)
    backfilled(timeline, a_past_lease(clock.now - timedelta(hours=1)))
    expected = the_long_way(timeline, clock.now)
    assert 1 == expected["gpubot_reclaims_total"]["l40s", "idle", "vision"]
    same(expected, scraped(watching))
    same(expected, scraped(restarted))
    same(expected, scraped(a_collector(timeline)))  # a replica starting from the checkpoint
    assert store_checkpoint(timeline.db, clock.now)  # same time, newer ids: moved on
    with timeline.db.read() as session:
        stored = session.get(MetricsCheckpointRow, 1)
        assert stored is not None
        assert ["l40s", "vision", "idle", 1] in stored.totals["reclaims"]
    same(expected, scraped(a_collector(timeline)))
    with timeline.db.write() as session:
        session.execute(sa.delete(MetricsCheckpointRow))
    same(expected, scraped(a_collector(timeline)))  # the whole history, once


def test_a_checkpoint_stored_without_its_ids_is_not_trusted(
    timeline: Services, clock: Clock
) -> None:
    """A checkpoint from before the totals kept their ids cannot tell the rows written late
    since: the first scrape counts the whole history instead, and the leader's next
    checkpoint replaces it."""
    assert store_checkpoint(timeline.db, clock.now)
    with timeline.db.write() as session:
        stored = session.get(MetricsCheckpointRow, 1)
        assert stored is not None
        old = {k: v for k, v in stored.totals.items() if k in ("requests", "reclaims", "gpu_s")}
        stored.totals = {**old, "reclaims": [["l40s", "platform", "expired", 7]]}
        session.add(stored)
    same(the_long_way(timeline, clock.now), scraped(a_collector(timeline)))
    assert store_checkpoint(timeline.db, clock.now)
    with timeline.db.read() as session:
        stored = session.get(MetricsCheckpointRow, 1)
        assert stored is not None
        assert [["l40s", "platform", "expired", 1]] == stored.totals["reclaims"]


def test_two_replicas_tell_what_the_rows_say_at_every_step(
    timeline: Services, clock: Clock
) -> None:
    """Two collectors on one database (two replicas, one restarted midway) scraped after a
    borrow, a shrink, a release, a backfilled lease and the leader's checkpoints: each scrape
    equals the rows, and no counter of either goes down."""
    one, two = a_collector(timeline), a_collector(timeline)
    with timeline.db.read() as session:
        alice = session.exec(
            select(LeaseRow).where(
                LeaseRow.holder == ALICE, LeaseRow.pool == "l40s", LeaseRow.state == "active"
            )
        ).one()
    assert (4, 1) == (alice.gpus, 4 - 3)  # vision's nominal is 3: one borrowed
    lease_id = alice.id or 0
    shown: dict[int, dict[str, Any]] = {}

    def check() -> None:
        expected = the_long_way(timeline, clock.now)
        for k, registry in enumerate((one, two)):
            found = scraped(registry)
            same(expected, found)
            for name in HISTORY:
                before = shown.get(k, {}).get(name, {})
                assert all(found[name].get(key, 0) >= n for key, n in before.items()), name
            shown[k] = found

    check()
    steps: list[Callable[[], object]] = [
        lambda: asked(timeline, CAROL, BorrowAsk("l40s", 1, timedelta(hours=2))),
        lambda: timeline.shrink(ALICE, lease_id, keep=2),
        lambda: timeline.release(ALICE, lease_id),
        lambda: store_checkpoint(timeline.db, clock.now),
        lambda: backfilled(timeline, a_past_lease(clock.now - timedelta(hours=2))),
    ]
    for k, step in enumerate(steps):
        clock.advance(timedelta(minutes=7))
        step()
        if k == 2:
            two = a_collector(timeline)  # restarted: from the checkpoint, or the whole history
            shown.pop(1, None)
        check()


def test_a_first_scrape_with_no_checkpoint_equals_the_rows_counted_one_by_one(
    timeline: Services, clock: Clock, watching: CollectorRegistry
) -> None:
    """A process's first scrape before the leader stored any checkpoint counts the whole
    history in grouped SQL; it equals the counters recounted from the rows one by one (ended
    leases a shrink made smaller, one still running shrunk, a backfilled lease of two GPUs),
    what the collector that watched all along says, and a replica's first scrape from the
    checkpoint the leader stores next."""
    with timeline.db.read() as session:
        alice = session.exec(
            select(LeaseRow).where(
                LeaseRow.holder == ALICE, LeaseRow.pool == "l40s", LeaseRow.state == "active"
            )
        ).one()
        bob = session.exec(
            select(LeaseRow).where(LeaseRow.holder == BOB, LeaseRow.state == "active")
        ).one()
    clock.advance(timedelta(minutes=20))
    timeline.shrink(ALICE, alice.id or 0, keep=2)
    timeline.shrink(BOB, bob.id or 0, keep=5)
    clock.advance(timedelta(minutes=25))
    timeline.release(ALICE, alice.id or 0)
    two = (("l40s-node-02", 2), ("l40s-node-02", 3))
    backfilled(timeline, replace(a_past_lease(clock.now - timedelta(hours=3)), gpus=two))
    clock.advance(timedelta(minutes=10))
    with timeline.db.read() as session:
        assert session.get(MetricsCheckpointRow, 1) is None
        shrunk = session.exec(
            select(LeaseGpuRow).where(col(LeaseGpuRow.released_at).is_not(None))
        ).all()
    assert {alice.id, bob.id} == {row.lease_id for row in shrunk}
    expected = the_long_way(timeline, clock.now)
    first = scraped(a_collector(timeline))
    same(expected, first)
    same(first, scraped(watching))
    assert store_checkpoint(timeline.db, clock.now)
    same(first, scraped(a_collector(timeline)))


def test_the_fleet_figures_equal_the_gpu_and_node_rows(timeline: Services, clock: Clock) -> None:
    """GPUs by pool and place, unreserved GPUs, nodes by reporting state and each node's
    telemetry age, against the rows the status command reads."""
    found = figures(timeline)
    places: Counter[tuple[str, str]] = Counter()
    for line in timeline.fleet_lines():
        place = str(line.place)
        if line.place == Place.OUT:
            place = GpuState.DRAINED if line.drained else line.state
        places[line.pool, place] += 1
    assert dict(places) == family(found, "gpubot_gpus")
    assert {("l40s", "occupied"), ("inference", "drained")} <= set(places)
    unreserved = {(p,): float(places[p, "occupied"]) for p in timeline.policy.pools}
    assert unreserved == family(found, "gpubot_unreserved_gpus")
    with timeline.db.read() as session:
        nodes = session.exec(select(NodeRow)).all()
        gpus = session.exec(select(GpuRow)).all()
    assert Counter((n.pool, n.reporting) for n in nodes) == family(found, "gpubot_nodes")
    newest: dict[int, datetime] = {}
    for gpu in gpus:
        if gpu.profiled_at is not None:
            newest[gpu.node_id] = max(gpu.profiled_at, newest.get(gpu.node_id, gpu.profiled_at))
    ages = {
        (n.name, n.pool): (clock.now - newest[n.id or 0]).total_seconds()
        for n in nodes
        if n.id in newest
    }
    assert {("l40s-node-01", "l40s"): 300.0, ("l40s-node-02", "l40s"): 300.0} == ages
    assert ages == family(found, "gpubot_node_telemetry_age_seconds")


def test_quota_queue_and_history_figures_equal_the_request_and_lease_rows(
    timeline: Services, clock: Clock
) -> None:
    """Quota use and borrowing per pool and team, the queue and approvals with their oldest
    waits, requests by outcome, reclaims by reason and GPU-seconds held."""
    found = figures(timeline)
    now = clock.now
    with timeline.db.read() as session:
        leases = session.exec(select(LeaseRow)).all()
        requests = session.exec(select(RequestRow)).all()
        held_gpus = session.exec(select(LeaseGpuRow, LeaseRow).join(LeaseRow)).all()
    used: Counter[tuple[str, str]] = Counter()
    for lease in leases:
        if lease.state == "active":
            used[lease.pool, lease.team] += lease.gpus
    quotas = {
        (p, t): q for p, pool in timeline.policy.pools.items() for t, q in pool.quotas.items()
    }
    assert {k: q.nominal for k, q in quotas.items()} == family(found, "gpubot_quota_nominal_gpus")
    assert {k: used[k] for k in quotas} == family(found, "gpubot_quota_used_gpus")
    borrowed = {k: max(0, used[k] - q.nominal) for k, q in quotas.items()}
    assert borrowed == family(found, "gpubot_quota_borrowed_gpus")
    assert 1 == borrowed["l40s", "vision"]  # Alice's 4 L40S against vision's nominal 3
    for state, count, wait in (
        ("queued", "gpubot_queue_length", "gpubot_queue_oldest_wait_seconds"),
        ("pending", "gpubot_approvals_pending", "gpubot_approvals_oldest_wait_seconds"),
    ):
        waiting = [r for r in requests if r.state == state]
        assert {(p,): sum(r.pool == p for r in waiting) for p in timeline.policy.pools} == family(
            found, count
        )
        oldest = {
            (p,): max((now - r.created_at).total_seconds() for r in waiting if r.pool == p)
            for p in {r.pool for r in waiting}
        }
        assert oldest == {k: v for k, v in family(found, wait).items() if v}
    assert 1 == family(found, "gpubot_queue_length")["l40s",]
    outcomes = Counter((r.kind, r.outcome, r.pool, r.team) for r in requests)
    assert outcomes == family(found, "gpubot_requests_total")
    reclaims = Counter((x.pool, x.end_reason, x.team) for x in leases if x.state == "reclaimed")
    assert {("l40s", "expired", "platform"): 1} == reclaims
    assert reclaims == family(found, "gpubot_reclaims_total")
    seconds: dict[tuple[str, str], float] = {}
    for held, lease in held_gpus:
        end = held.released_at or lease.ended_at or now
        key = (lease.pool, lease.team)
        seconds[key] = seconds.get(key, 0.0) + (end - lease.granted_at).total_seconds()
    assert seconds == pytest.approx(family(found, "gpubot_lease_gpu_seconds_total"))
    assert 90 * 60 == pytest.approx(seconds["l40s", "platform"])  # Erin's 1 GPU, 9:00-10:30


def test_backlog_pause_rules_and_audit_figures_equal_the_rows(
    timeline: Services, clock: Clock
) -> None:
    """Outbox messages by state and the oldest still owed, the inbox, the kill switch and
    since when, the rules in force and the audit chain."""
    found = figures(timeline)
    with timeline.db.read() as session:
        states = Counter(session.exec(select(OutboxRow.state)).all())
        owed = session.exec(
            select(sa.func.min(OutboxRow.created_at)).where(
                col(OutboxRow.state).in_(("pending", "sending"))
            )
        ).one()
        inbox = len(session.exec(select(InboxRow)).all())
        paused = session.get(SettingRow, keyvalue.PAUSED)
    assert {(s,): float(states.get(s, 0)) for s in outbox_states()} == family(
        found, "gpubot_outbox_messages"
    )
    assert states["pending"] > 0  # what the drain and the pause owe, not delivered yet
    oldest = 0.0 if owed is None else (clock.now - as_utc(owed)).total_seconds()
    assert oldest == family(found, "gpubot_outbox_oldest_age_seconds")[()]
    assert float(inbox) == family(found, "gpubot_inbox_pending")[()]
    assert 1.0 == family(found, "gpubot_automation_paused")[()]
    since = family(found, "gpubot_automation_paused_since_timestamp_seconds")[()]
    assert paused is not None
    assert paused.updated_at.timestamp() == since == (clock.now - timedelta(minutes=3)).timestamp()
    revision = timeline.policy.revision
    assert {(timeline.engine_name, revision): 1.0} == family(found, "gpubot_rules_info")
    assert 1.0 == family(found, "gpubot_audit_chain_ok")[()]
    assert 1.0 == family(found, "gpubot_database_up")[()]
    assert 1.0 == family(found, "gpubot_healthy")[()]


def outbox_states() -> tuple[str, ...]:
    return ("pending", "sending", "delivered", "dropped", "failed")


def as_utc(value: Any) -> datetime:
    """A bare aggregate's time (SQLite hands back text) as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def test_no_label_names_a_person(timeline: Services) -> None:
    """Only pools, teams, nodes, states, reasons, outcomes and kinds label the figures; no
    value is a Slack user id or a Unix user seen on a GPU."""
    found = figures(timeline)
    names = {name for _, labels in found for name, _ in labels}
    assert names <= LABELS | {"le", "revision", "engine"}
    values = {value for _, labels in found for _, value in labels}
    assert set() == values & PEOPLE
    assert [] == [v for v in values if re.fullmatch(r"[UW][A-Z0-9]{6,}", v)]


def test_an_edited_audit_tail_reads_as_a_broken_chain(services: Services) -> None:
    """Rewriting the last audit row, or dropping it, turns gpubot_audit_chain_ok to 0."""
    assert 1.0 == family(figures(services), "gpubot_audit_chain_ok")[()]  # nothing yet
    asked(services, ALICE, BorrowAsk("l40s", 1))
    asked(services, CAROL, BorrowAsk("l40s", 1))
    assert 1.0 == family(figures(services), "gpubot_audit_chain_ok")[()]
    with services.db.write() as session:
        last = session.exec(select(AuditRow).order_by(col(AuditRow.id).desc())).first()
        assert last is not None
        last_id = last.id
        session.execute(
            sa.update(AuditRow).where(col(AuditRow.id) == last_id).values(outcome="edited")
        )
    assert 0.0 == family(figures(services), "gpubot_audit_chain_ok")[()]
    with services.db.write() as session:
        session.execute(sa.delete(AuditRow).where(col(AuditRow.id) == last_id))
    assert 0.0 == family(figures(services), "gpubot_audit_chain_ok")[()]


def test_a_request_decision_is_timed(services: Services) -> None:
    """Each borrow's decision lands in gpubot_decision_seconds."""
    before = family(figures(services), "gpubot_decision_seconds_count")[()]
    asked(services, ALICE, BorrowAsk("l40s", 1))
    assert before + 1 <= family(figures(services), "gpubot_decision_seconds_count")[()]
    assert ["gpubot_decision_seconds"] == [m.name for m in DECISION_SECONDS.describe()]


class Many:
    """A family big enough for scrape's quick way, with every awkward label and value."""

    def __init__(self, kind: Callable[..., Any]) -> None:
        self.kind = kind

    def collect(self) -> list[Any]:
        family = self.kind("gpubot_many", 'help with \\ and\na "quote"', labels=["pool", "node"])
        values = [0, 1, 2.5, 1796219605.3034394, 1e21, -3.0, math.inf, -math.inf, math.nan]
        names = ["plain", 'qu"ote', "back\\slash", "new\nline", "ünïcode", ""]
        for i in range(300):
            family.add_metric([f"{names[i % len(names)]}-{i}", "a100"], values[i % len(values)])
        return [family]


@pytest.mark.parametrize(
    "kind",
    [
        GaugeMetricFamily,
        CounterMetricFamily,
        ManySamples,
        partial(ManySamples, typ="counter"),
    ],
)
def test_a_big_family_is_written_as_prometheus_client_writes_it(kind: Callable[..., Any]) -> None:
    """scrape's quick ways for a family of many samples (a plain family, or one kept as
    pairs, its labels given out of order) write the same bytes as prometheus_client."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Many(kind))
    assert generate_latest(registry) == scrape(registry)


@pytest.mark.parametrize(
    ("authorization", "token", "ok"),
    [
        (None, None, True),
        ("Bearer s3cret", "s3cret", True),
        ("bearer  s3cret ", "s3cret", True),
        (None, "s3cret", False),
        ("Bearer wrong", "s3cret", False),
        ("Basic s3cret", "s3cret", False),
        ("s3cret", "s3cret", False),
    ],
)
def test_the_bearer_token_guards_metrics(
    authorization: str | None, token: str | None, ok: bool
) -> None:
    """No token: open; a token: only `Authorization: Bearer <token>` reads."""
    assert ok == allowed(authorization, token)


# ---- what deploy/ ships --------------------------------------------------------------------

METRIC = re.compile(r"\bgpubot_[a-z0-9_]+\b")


@pytest.fixture
def exposed(timeline: Services) -> set[str]:
    """The sample names a scrape of the timeline carries."""
    return {name for name, _ in figures(timeline)}


# What deploy/ ships is read once; the database it is checked against does not change it.
ON_SQLITE = pytest.mark.parametrize("database_to_build", ["sqlite"], indirect=True)


@ON_SQLITE
def test_alert_rules_parse_and_name_only_exposed_metrics(exposed: set[str]) -> None:
    """deploy/prometheus/alerts.yaml: rule groups with the five alerts the issue asks for,
    each with an expression over metrics /metrics has, a severity and a summary."""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    alerts = {r["alert"]: r for group in rules["groups"] for r in group["rules"]}
    assert {
        "GpubotTelemetryStale",
        "GpubotOutboxBacklog",
        "GpubotInboxBacklog",
        "GpubotAutomationPausedLong",
        "GpubotAuditChainBroken",
        "GpubotQueueWaitHigh",
    } <= set(alerts)
    for name, rule in alerts.items():
        named = set(METRIC.findall(rule["expr"]))
        assert named, name
        assert named <= exposed, f"{name}: {named - exposed}"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"], name


@ON_SQLITE
def test_the_dashboard_is_grafana_json_over_exposed_metrics(exposed: set[str]) -> None:
    """deploy/grafana/gpubot-dashboard.json: panels whose every expression names metrics
    /metrics has, covering the fleet, quotas, the queue, reclaims, telemetry, the backlog and
    latency."""
    dashboard = json.loads((DEPLOY / "grafana" / "gpubot-dashboard.json").read_text())
    assert dashboard["title"]
    assert dashboard["panels"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    named = {m for e in exprs for m in METRIC.findall(e)}
    assert named <= exposed, named - exposed
    assert {
        "gpubot_gpus",
        "gpubot_quota_used_gpus",
        "gpubot_queue_length",
        "gpubot_queue_oldest_wait_seconds",
        "gpubot_reclaims_total",
        "gpubot_node_telemetry_age_seconds",
        "gpubot_outbox_messages",
        "gpubot_decision_seconds_bucket",
        "gpubot_sweep_seconds_bucket",
    } <= named
