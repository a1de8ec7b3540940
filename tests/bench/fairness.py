"""Benchmark: fair sharing on a simulated workload, three policies side by side.

A seeded workload (tests.bench.fairness_workload: four teams, two pools, two weeks, some 1,300
requests) is replayed through the real use cases on a SQLite file with a controlled clock,
once per policy; the policies differ only in their limits.yaml. People borrow when their job
arrives; a manager approves every `ask` a few minutes later; a job that ends early is
released then, and otherwise runs to its lease's end, where the sweep ends it. The scheduler's
jobs are played as bot.main runs them: every owed message is delivered at once (the outbox job
runs every 2 s), and the sweep job (a sweep pass, then the queue) runs on a grid of TICK,
skipping stretches where nothing waits and no lease nears its end. A lease recalled from its
holder is lost work: its run so far counts as preempted GPU-hours.
Run with `python -m tests.bench.fairness`. Reports figures; never fails.
"""

from __future__ import annotations

import heapq
import itertools
import math
import multiprocessing
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlmodel import col, select

from bot.main import SWEEP_EVERY
from bot.services import BorrowAsk, Services
from bot.services.results import BorrowResult
from bot.services.rule_files import read_rules_dir
from bot.telemetry.window import TelemetryWindow
from rules.domain import LeaseState, RequestKind, RequestState, format_duration
from storage import leases as storage_leases
from storage import migrate, outbox
from storage import requests as storage_requests
from storage.audit import AuditTag
from storage.db import Database
from storage.tables import AuditRow, LeaseRow, OutboxRow, RequestRow
from tests.bench import fairness_workload as world
from tests.bench.fairness_workload import Job

SEED = 13
START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)  # a Monday
SPAN = timedelta(days=14)
TICK_BOT = SWEEP_EVERY  # how often bot.main runs the sweep job
TICK = timedelta(minutes=5)  # how often the bench runs it: coarser, to fit in minutes
APPROVAL_DELAY = (timedelta(minutes=5), timedelta(minutes=20))


class Clock:
    """The simulated clock every use case reads."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


# ---- replaying the workload -------------------------------------------------------------

ARRIVE, APPROVE, FINISH = 0, 1, 2  # event kinds, in the order they go at one instant


class _Delays:
    """A manager answers within APPROVAL_DELAY: a fixed cycle, so every policy sees the same."""

    def __init__(self) -> None:
        low, high = APPROVAL_DELAY
        self._cycle = itertools.cycle(
            [low + (high - low) * k / 7 for k in (3, 0, 6, 2, 5, 1, 7, 4)]
        )

    def next(self) -> timedelta:
        return next(self._cycle)


@dataclass
class Replay:
    """One policy's run: the services on their own database, the events still to come."""

    services: Services
    clock: Clock
    tick: timedelta
    events: list[tuple[datetime, int, int, object]] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)
    jobs: dict[int, Job] = field(default_factory=dict)  # request id -> its job
    guaranteed: set[int] = field(default_factory=set)  # requests inside nominal when made
    approvals: set[int] = field(default_factory=set)  # requests a manager will settle
    approved_at: dict[int, datetime] = field(default_factory=dict)  # request id -> when
    delays: _Delays = field(default_factory=_Delays)
    skip_idle: bool = True  # False: the sweep job runs on every tick, idle or not
    last_lease: int = 0
    sweeps: int = 0
    telemetry: TelemetryWindow = field(init=False)

    def __post_init__(self) -> None:
        # No samples: every GPU reads unknown, so nothing is idle-reclaimed; expiry, recall
        # and the queue decide alone.
        self.telemetry = TelemetryWindow(self.services.policy.timing.stale_after)

    def at(self, when: datetime, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (when, kind, next(self.seq), payload))

    def run(self, jobs: Sequence[Job], until: datetime) -> None:
        for job in jobs:
            self.at(job.at, ARRIVE, job)
        next_tick = _grid(jobs[0].at if jobs else until, self.tick)
        while True:
            when = self.events[0][0] if self.events else until
            if next_tick <= when:
                if next_tick >= until:
                    break
                self.clock.now = next_tick
                self.sweep_job()
                self.settle_new()
                next_tick = self.next_tick(next_tick + self.tick, until)
                continue
            if when >= until:
                break
            _, kind, _, payload = heapq.heappop(self.events)
            self.clock.now = when
            self.handle(kind, payload)
            self.settle_new()
            soon = _grid(when, self.tick)
            if next_tick > soon:  # idle so far: this may have started something
                next_tick = min(next_tick, self.next_tick(soon, until))

    def handle(self, kind: int, payload: object) -> None:
        services = self.services
        if kind == ARRIVE:
            assert isinstance(payload, Job)
            self.arrive(payload)
        elif kind == APPROVE:
            assert isinstance(payload, tuple)
            manager, request_id = payload
            services.approve(manager, request_id, "simulated manager")
            self.approved_at[request_id] = self.clock.now
        else:
            assert isinstance(payload, tuple)
            holder, lease_id = payload
            services.release(holder, lease_id)  # refused when it ended meanwhile: fine

    def arrive(self, job: Job) -> None:
        inside = self.inside_nominal(job)
        ask = BorrowAsk(job.pool, job.gpus, job.duration, job.priority, "fairness bench")
        result = self.services.borrow(job.user, ask)
        if not isinstance(result, BorrowResult):
            return
        self.jobs[result.request.id] = job
        if inside:
            self.guaranteed.add(result.request.id)

    def inside_nominal(self, job: Job) -> bool:
        """Held plus the team's waiting requests plus this one within the team's nominal."""
        with self.services.db.read() as session:
            held = storage_leases.held_by_team(session, job.pool).get(job.team, 0)
            waiting = session.exec(
                select(RequestRow.gpus).where(
                    RequestRow.pool == job.pool,
                    RequestRow.team == job.team,
                    RequestRow.state == RequestState.QUEUED,
                )
            ).all()
        nominal = self.services.policy.pools[job.pool].quotas[job.team].nominal
        return held + sum(waiting) + job.gpus <= nominal

    def sweep_job(self) -> None:
        """bot.main's sweep job: one reconcile pass, then the queue."""
        self.services.sweep(self.telemetry)
        self.services.serve_queue()
        self.sweeps += 1

    def settle_new(self) -> None:
        """After every step: deliver what is owed, plan the releases of newly granted work
        that ends early, and have a manager answer each new approval card."""
        now = self.clock.now
        with self.services.db.read() as session:
            owed = session.exec(select(OutboxRow.id).where(OutboxRow.state == outbox.PENDING)).all()
            new = session.exec(
                select(LeaseRow.id, RequestRow.id, LeaseRow.holder, LeaseRow.granted_at)
                .join(RequestRow, col(RequestRow.lease_id) == col(LeaseRow.id))
                .where(col(LeaseRow.id) > self.last_lease, RequestRow.kind == RequestKind.BORROW)
            ).all()
            pending = [
                (r.id, r.approvers[0])
                for r in storage_requests.pending(session)
                if r.id not in self.approvals
            ]
        if owed:
            with self.services.db.write() as session:
                for row_id in owed:
                    assert row_id is not None
                    outbox.delivered(session, row_id, at=now, channel="D0BENCH", ts="1.0")
        for lease_id, request_id, holder, granted_at in new:
            assert lease_id is not None
            self.last_lease = max(self.last_lease, lease_id)
            job = self.jobs.get(request_id or 0)
            if job is not None and job.ends_early:
                self.at(max(now, granted_at + job.runs_for), FINISH, (holder, lease_id))
        for request_id, approver in pending:
            assert request_id is not None
            self.approvals.add(request_id)
            self.at(now + self.delays.next(), APPROVE, (approver, request_id))

    def next_tick(self, candidate: datetime, until: datetime) -> datetime:
        """`candidate` while anything waits or is recalled; else the first grid point at which
        a lease's expiry warning or reclaim falls due (an idle stretch is skipped)."""
        if not self.skip_idle:
            return candidate
        with self.services.db.read() as session:
            busy = bool(storage_requests.pools_with_queue(session)) or any(
                storage_leases.any_recalled(session, pool) for pool in world.POOLS
            )
            if busy:
                return candidate
            ends = session.exec(
                select(LeaseRow.expires_at).where(LeaseRow.state == LeaseState.ACTIVE)
            ).all()
        timing = self.services.policy.timing
        if any(end + timing.grace < candidate - self.tick for end in ends):
            return candidate  # an ended lease the sweep has still to reclaim
        due = [
            moment
            for end in ends
            for moment in (*(end - lead for lead in timing.expiry_leads), end + timing.grace)
            if moment >= candidate - self.tick
        ]
        return max(candidate, _grid(min(due, default=until), self.tick))


def _grid(moment: datetime, tick: timedelta) -> datetime:
    """The first grid point at or after `moment` (ticks from START)."""
    steps = -((START - moment) // tick)
    return START + steps * tick


# ---- what each policy did ---------------------------------------------------------------


@dataclass
class Figures:
    """One policy's run, in the table's terms."""

    policy: str
    requests: int = 0
    granted: int = 0
    denied: int = 0
    timed_out: int = 0  # withdrawn after max_queue_wait: starved
    waiting_at_end: int = 0
    leases: int = 0
    preempted: int = 0
    lost_gpu_h: float = 0.0
    allocation_pct: float = 0.0
    guarantee_waits_min: list[float] = field(default_factory=list)
    other_waits_min: dict[str, list[float]] = field(default_factory=dict)
    usage_gpu_h: dict[str, dict[str, float]] = field(default_factory=dict)  # pool -> team -> h
    jain: dict[str, float] = field(default_factory=dict)
    sweeps: int = 0
    seconds: float = 0.0
    notice: timedelta = timedelta(0)  # recall.notice of the policy

    @property
    def per_100_leases(self) -> float:
        return 100 * self.preempted / self.leases if self.leases else 0.0


def measure(replay: Replay, policy: str, start: datetime, until: datetime) -> Figures:
    figures = Figures(policy, sweeps=replay.sweeps, notice=replay.services.policy.recall.notice)
    with replay.services.db.read() as session:
        requests = session.exec(select(RequestRow).where(RequestRow.kind == RequestKind.BORROW))
        leases = {row.id: row for row in session.exec(select(LeaseRow)).all()}
        timed_out = session.exec(
            select(AuditRow.id).where(AuditRow.tag == AuditTag.QUEUE_TIMED_OUT)
        ).all()
        for request in requests.all():
            _count_request(figures, replay, request, leases.get(request.lease_id or 0))
    figures.timed_out = len(timed_out)
    _count_leases(figures, list(leases.values()), start, until)
    return figures


def _count_request(
    figures: Figures, replay: Replay, request: RequestRow, lease: LeaseRow | None
) -> None:
    figures.requests += 1
    figures.denied += request.state == RequestState.DENIED
    figures.waiting_at_end += request.state in (RequestState.QUEUED, RequestState.PENDING)
    if lease is None:
        return
    figures.granted += 1
    # As max_queue_wait counts: from when it was made, or when a manager approved it.
    ready = max(request.created_at, replay.approved_at.get(request.id or 0, request.created_at))
    waited = max(0.0, (lease.granted_at - ready) / timedelta(minutes=1))
    if request.id in replay.guaranteed:
        figures.guarantee_waits_min.append(waited)
    else:
        figures.other_waits_min.setdefault(request.team, []).append(waited)


def _count_leases(
    figures: Figures, leases: list[LeaseRow], start: datetime, until: datetime
) -> None:
    held_h = 0.0
    for lease in leases:
        ended = min(lease.ended_at or until, until)
        hours = lease.gpus * max(0.0, (ended - max(lease.granted_at, start)) / timedelta(hours=1))
        held_h += hours
        by_team = figures.usage_gpu_h.setdefault(lease.pool, {})
        by_team[lease.team] = by_team.get(lease.team, 0.0) + hours
        if lease.end_reason == "preempted":
            figures.preempted += 1
            figures.lost_gpu_h += hours
    figures.leases = len(leases)
    size = sum(world.pool_size(pool) for pool in world.POOLS)
    figures.allocation_pct = 100 * held_h / (size * (until - start) / timedelta(hours=1))
    for pool, by_team in figures.usage_gpu_h.items():
        teams = world.QUOTAS[pool]
        figures.jain[pool] = jain([by_team.get(t, 0.0) / world.WEIGHTS[t] for t in teams])


def jain(shares: Sequence[float]) -> float:
    """Jain's fairness index: 1 when every share is equal, 1/n when one takes everything."""
    total, squares = sum(shares), sum(x * x for x in shares)
    return total * total / (len(shares) * squares) if squares else 1.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank; nan when there is nothing to rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# ---- running it -------------------------------------------------------------------------


def run_policy(
    policy: str, jobs: Sequence[Job], span: timedelta, tick: timedelta, *, skip_idle: bool = True
) -> Figures:
    started = time.perf_counter()
    until = START + span
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-fairness-") as name:
        tmp = Path(name)
        url = f"sqlite:///{tmp / 'gpubot.db'}"
        migrate.upgrade(url)
        db = Database(url)
        clock = Clock(START)
        services = Services.open(db, read_rules_dir(world.rules_dir(tmp, policy)), clock=clock)
        try:
            replay = Replay(services, clock, tick, skip_idle=skip_idle)
            replay.run(jobs, until)
            figures = measure(replay, policy, START, until)
        finally:
            services.close()
            db.dispose()
    figures.seconds = time.perf_counter() - started
    return figures


def compare(
    jobs: Sequence[Job], span: timedelta, tick: timedelta, *, parallel: bool = True
) -> list[Figures]:
    """Each policy over the same jobs, one process each when `parallel`."""
    if not parallel:
        return [run_policy(policy, jobs, span, tick) for policy in world.POLICY_NAMES]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(world.POLICY_NAMES), mp_context=context) as pool:
        runs = [pool.submit(run_policy, p, jobs, span, tick) for p in world.POLICY_NAMES]
        return [run.result() for run in runs]


# ---- the report -------------------------------------------------------------------------


def minutes(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}m"


def waits(values: Sequence[float]) -> str:
    return f"{minutes(percentile(values, 0.5))} / {minutes(percentile(values, 0.95))}"


def rows(figures: Sequence[Figures]) -> list[tuple[str, list[str]]]:
    """The table's rows: a label, then one cell per policy."""
    out: list[tuple[str, list[str]]] = [
        (
            "requests made / granted / denied",
            [f"{f.requests:,} / {f.granted:,} / {f.denied:,}" for f in figures],
        ),
        ("GPU allocation", [f"{f.allocation_pct:.1f}%" for f in figures]),
        ("guarantee wait p50 / p95", [waits(f.guarantee_waits_min) for f in figures]),
        ("  (in-nominal requests granted)", [f"{len(f.guarantee_waits_min):,}" for f in figures]),
    ]
    for team in world.WEIGHTS:
        label = f"non-guaranteed wait p50 / p95, {team}"
        out.append((label, [waits(f.other_waits_min.get(team, [])) for f in figures]))
    out += [
        (
            "preemptions per 100 leases",
            [f"{f.per_100_leases:.1f} ({f.preempted})" for f in figures],
        ),
        ("preempted GPU-hours lost", [f"{f.lost_gpu_h:,.0f}" for f in figures]),
    ]
    for pool in world.POOLS:
        out.append(
            (
                f"Jain's index of usage/weight, {pool}",
                [f"{f.jain.get(pool, 1.0):.3f}" for f in figures],
            )
        )
    out += [
        ("starvation (withdrawn after max_queue_wait)", [f"{f.timed_out}" for f in figures]),
        ("still waiting at the end", [f"{f.waiting_at_end}" for f in figures]),
        ("sweep jobs run / wall time", [f"{f.sweeps:,} / {f.seconds:.0f} s" for f in figures]),
    ]
    return out


def budget(figures: Sequence[Figures], tick: timedelta) -> list[tuple[str, str, str, str, bool]]:
    """(budget, ours, reference, ratio, met) for gpubot's policy against the others."""
    by = {f.policy: f for f in figures}
    ours, kueue = by["gpubot"], by["Kueue-like"]
    best = max(figures, key=lambda f: f.allocation_pct)
    bound = (ours.notice + 2 * tick) / timedelta(minutes=1)
    p95 = percentile(ours.guarantee_waits_min, 0.95)
    p95 = 0.0 if math.isnan(p95) else p95
    return [
        (
            "GPU allocation within 2 points of the best policy",
            f"{ours.allocation_pct:.1f}%",
            f"{best.allocation_pct:.1f}% ({best.policy})",
            ratio(ours.allocation_pct, best.allocation_pct),
            ours.allocation_pct >= best.allocation_pct - 2,
        ),
        (
            "guarantee wait p95 <= notice + 2 sweeps",
            minutes(p95),
            f"{bound:.0f}m",
            ratio(p95, bound),
            p95 <= bound,
        ),
        ("zero starvation", f"{ours.timed_out}", "0", "-", ours.timed_out == 0),
        (
            "fewer preemptions than the Kueue-like baseline",
            f"{ours.per_100_leases:.1f}/100",
            f"{kueue.per_100_leases:.1f}/100",
            ratio(ours.per_100_leases, kueue.per_100_leases),
            ours.preempted == 0 or ours.per_100_leases < kueue.per_100_leases,
        ),
    ]


def ratio(ours: float, reference: float) -> str:
    return f"{ours / reference:.2f}x" if reference else "-"


def report(
    figures: Sequence[Figures], jobs: Sequence[Job], span: timedelta, tick: timedelta
) -> None:
    sizes = ", ".join(f"{pool} {world.pool_size(pool)} GPUs" for pool in world.POOLS)
    weights = ", ".join(f"{team} {w:g}" for team, w in world.WEIGHTS.items())
    teams, over = len(world.WEIGHTS), format_duration(span)
    print(
        f"Workload: {len(jobs):,} requests from {teams} teams over {over} (seed {SEED}) on {sizes};"
    )
    print(f"weights {weights}")
    every, bot = format_duration(tick), format_duration(TICK_BOT)
    print(f"The sweep job every {every} of simulated time (bot.main runs it every {bot}), skipped")
    print("while nothing waits and no lease nears its end; owed messages are delivered at once;")
    print("managers approve each ask after 5-20m. Waits run from when a request was made, or")
    print("approved by its manager, to its grant.")
    print()
    table = rows(figures)
    width = max(len(label) for label, _ in table) + 2
    cell = max(14, *(len(c) + 2 for _, cells in table for c in cells))
    print(" " * width + "".join(f"{f.policy:>{cell}}" for f in figures))
    for label, cells in table:
        print(f"{label:<{width}}" + "".join(f"{c:>{cell}}" for c in cells))
    print()
    print(f"  {'budget (gpubot)':<52}{'ours':>12}{'reference':>24}{'ratio':>8}  result")
    for line, ours, reference, times, met in budget(figures, tick):
        print(f"  {line:<52}{ours:>12}{reference:>24}{times:>8}  {'PASS' if met else 'MISS'}")


def main() -> int:
    py = platform.python_version()
    print(f"gpubot benchmark: Python {py} on {platform.machine()}, {platform.system()}")
    print()
    jobs = world.generate(SEED, START, SPAN)
    print(f"Replaying {len(jobs):,} requests under {len(world.POLICY_NAMES)} policies, one process")
    print("each (about 4 minutes on 2 cores) ...", flush=True)
    print()
    report(compare(jobs, SPAN, TICK), jobs, SPAN, TICK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
