"""A scripted timeline for the observe-mode report: an observe-only idle-reclaim rule over real
sweeps of three one-GPU leases, with the per-minute history stored as the poll job stores it.

Every lease idles from the start; the rule would reclaim each once it has idled 30 minutes (the
sweep at +31m). Afterwards the first lease works again 20 minutes later, the second idles on,
and the third's GPU sends nothing more. The timeline ends at +95m, past the hour after."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from bot.services import BorrowAsk, Services
from bot.services.results import LeaseView
from bot.telemetry.model import Sample
from bot.telemetry.window import TelemetryWindow
from storage import gpus
from tests.builders import a_sample, default_sources
from tests.unit.bot.conftest import ALICE, Clock, borrowed

OBSERVED_RULE = """
  - id: reclaim-idle-fast
    on: lease
    when: lease.idle and telemetry.fresh and lease.idle_for >= 30m
    then: reclaim idle
    mode: observe
    because: "idle for {lease.idle_for}"
"""
WOULD_HAVE_AT = timedelta(minutes=31)
BUSY_AGAIN_AT = timedelta(minutes=51)
ENDS_AT = timedelta(minutes=95)


def observing_sources() -> dict[str, str]:
    """The shipped rules plus the observe-only rule."""
    sources = default_sources()
    sources["sweep.yaml"] += OBSERVED_RULE
    return sources


@dataclass(frozen=True)
class Timeline:
    busy_again: LeaseView
    idle_on: LeaseView
    silent: LeaseView


def three_idle_leases(services: Services, clock: Clock, *, until: timedelta = ENDS_AT) -> Timeline:
    """Runs the timeline from the clock's now to `until` after it: samples every 30 s, the
    minute history stored and a sweep at each minute."""
    start = clock.now
    leases = []
    for _ in range(3):
        ask = BorrowAsk("a100", 1, timedelta(hours=8), reason="runs")
        lease = borrowed(services, ALICE, ask).lease
        assert lease is not None
        leases.append(lease)
    timeline = Timeline(*leases)
    window = TelemetryWindow(timedelta(minutes=3))
    while clock.now - start < until:
        clock.advance(timedelta(seconds=30))
        window.observe(_samples(timeline, clock.now - start, clock), now=clock.now)
        if clock.now.second == 0:
            _store(services, window, clock)
            services.sweep(window)
    _store(services, window, clock)
    return timeline


def _samples(timeline: Timeline, elapsed: timedelta, clock: Clock) -> list[Sample]:
    busy = 85.0 if elapsed >= BUSY_AGAIN_AT else 0.0
    readings = [(timeline.busy_again, busy), (timeline.idle_on, 0.0)]
    if elapsed <= WOULD_HAVE_AT:
        readings.append((timeline.silent, 0.0))
    return [
        a_sample(lease.gpus[0].node, lease.gpus[0].index, util, clock.now)
        for lease, util in readings
    ]


def _store(services: Services, window: TelemetryWindow, clock: Clock) -> None:
    rows = window.minute_rollups(clock.now)
    with services.db.write() as session:
        gpus.store_minutes(session, rows)
