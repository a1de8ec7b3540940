"""Benchmark: gpubot at 100,000 GPUs on 12,500 nodes, with the 10,000-GPU figures beside them
from the same run, on a SQLite file and on PostgreSQL.

Per fleet and database: one steady-state sweep (best of a few, after a first pass that wrote
the warnings in one transaction, and their delivery), one `/metrics` scrape (bot.metrics), and
agent ingest at one push of 8 samples per node per 30 s (~420 pushes/s at 12,500 nodes), open
loop, through the signed `Ingest` handler on a pool of threads as the HTTP server hands it
pushes; then the commands a person types (status, borrow, mine, why, release) with 10,000 GPUs
against the same commands with 100; the RSS of a real `gpubot serve` under a burst of commands
(tests.bench.scale_rss); and the `audit verify` / `audit export` figures
(tests.bench.audit_scale).

The fleets are tests.bench.sweep's (its nodes, leases and telemetry mix); their pools, nodes and
GPUs are bulk-inserted before the services open, so the inventory sync finds them in place.
Every figure is printed as ours, the budget, and their ratio, from one run. Figures only: it
never fails. Run with `python -m tests.bench.scale [--quick] [--sqlite-only | --postgres-only]`
(--quick: 1,000 and 10,000 GPUs). `--scrape-only [--history N] [--profile]` times only /metrics,
over N ended leases and their requests: the first scrape ever, a replica's first scrape from
the leader's checkpoint, and later ones, wall and CPU seconds. `--sweep-only [--profile]` times
only the sweeps: the first pass (wall and CPU seconds, and per action; `--first-committed`: a
transaction per action, as serve runs it after downtime, instead of one unit of work) and the
steady ones, wall and CPU seconds. `--commands-only [--profile]` times only the
commands, on --small and --compared GPUs open together and timed round by round, median wall
and CPU seconds and their ratios (`--profile`: where status spends its time on each).

`--ingest-only` measures ingest alone, for --ingest-s seconds per fleet and database (30 by
default there), three ways: pushes handed to the handler by threads in this process; signed
HTTP pushes from a separate driver process to the real ASGI front (uvicorn, bot.server); and
the same HTTP pushes while sweeps of the fleet run back to back in the serving process.
Each prints the rate offered and achieved, p50 and p99 from each push's due instant, and the
process's CPU time per push.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import http.client
import importlib
import math
import os
import platform
import pstats
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from slack_bolt import App

from bot import memory
from bot.server import AGENT_PATH, Background, SlackAsgi
from bot.services import BorrowAsk, Refused, Services
from bot.services.rule_files import read_rules_dir
from bot.telemetry.agent_push import Ingest
from bot.telemetry.model import Sample, sign, to_json
from bot.telemetry.window import TelemetryWindow
from storage import agent_reads, migrate
from storage.db import Database
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, PoolRow, RequestRow
from tests.bench import scale_rss
from tests.bench.sweep import (
    INTERVAL,
    NOW,
    PER_NODE,
    POOLS,
    Node,
    Slot,
    a_sample,
    deliver_all,
    feed,
    insert_leases,
    plan_nodes,
    rules_dir,
)
from tests.support import postgres

FLEETS = (10_000, 100_000)
QUICK = (1_000, 10_000)
SMALL = 100  # the commands with this many GPUs ...
COMPARED = 10_000  # ... against the same with this many
SWEEP_BUDGET_S = 3.0  # one sweep of 100,000 GPUs
SWEEP_10K_BUDGET_S = 1.0  # and of 10,000 (the design's table)
SCRAPE_BUDGET_S = 1.0
INGEST_P99_BUDGET_S = 0.2
KEPT_UP = 0.97  # ingest sustained: pushes answered per second over those offered, at least
SCALING_BUDGET = 12.0  # 10x the fleet costs at most this many times the time
ACTION_SCALING_BUDGET = 1.25  # a first-pass action on 10x the fleet: about the same cost
COMMAND_BUDGET = 1.5  # a command with 10,000 GPUs against the same with 100
AUDIT_BUDGET_S = 10.0
AUDIT_ROWS = 1_000_000
RSS_BUDGET_MB = 300.0
RSS_BURST = 200  # commands at serve, one per sender
RUNS = 3  # steady sweeps and scrapes: the best of this many
HISTORY = 200_000  # ended leases behind a scrape-only fleet (a busy year)
PUSH_EVERY_S = 30.0  # one push per node this often
INGEST_S = 10.0  # how long ingest is offered
INGEST_ONLY_S = 30.0  # and with --ingest-only: sustained
INGEST_WORKERS = 6  # asyncio.to_thread's default pool on 2 cores: min(32, cores + 4)
HTTP_SENDERS = 64  # the driver's threads, each with its own keep-alive connection
HTTP_TIMEOUT_S = 30.0
COMMAND_RUNS = 7  # each command this many times; the median counts
# The one typing the commands: a vision member the fleet's leases leave out, so that "mine"
# shows what they hold (the lease their borrow got), whatever the fleet's size.
TYPIST = "U0FRANK01"
KINDS = ("sqlite", "postgres")


# ---- databases and fleets ---------------------------------------------------------------


@contextmanager
def database(kind: str, tmp: Path, server: postgres.PostgresServer | None) -> Iterator[str]:
    """A fresh database of `kind`, migrated; its URL."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp / 'gpubot.db'}"
        migrate.upgrade(url)
        yield url
        return
    assert server is not None
    name = server.create_database()
    url = server.url_for(name)
    try:
        migrate.upgrade(url)
        yield url
    finally:
        server.drop_database(name)


def insert_inventory(db: Database, nodes: list[Node]) -> None:
    """Pools, nodes and GPUs in a few bulk inserts (the inventory sync then finds them)."""
    with db.write() as session:
        session.execute(
            sa.insert(PoolRow.__table__),  # type: ignore[attr-defined]
            [{"name": p, "model": m, "protected": prot} for p, m, _, prot in POOLS],
        )
        session.execute(
            sa.insert(NodeRow.__table__),  # type: ignore[attr-defined]
            [
                {"name": n.name, "pool": n.pool, "drained": False, "reporting": "unknown"}
                for n in nodes
            ],
        )
        named = sa.select(NodeRow.__table__.c.name, NodeRow.__table__.c.id)  # type: ignore[attr-defined]
        ids: dict[str, int] = {row.name: row.id for row in session.execute(named)}
        session.execute(
            sa.insert(GpuRow.__table__),  # type: ignore[attr-defined]
            [
                {
                    "node_id": ids[n.name],
                    "index": i,
                    "model": n.model,
                    "memory_mib": 0,
                    "pool": n.pool,
                    "state": "ok",
                    "observed": "unknown",
                    "occupants": [],
                }
                for n in nodes
                for i in range(PER_NODE)
            ],
        )


@dataclass
class Fleet:
    kind: str
    gpus: int
    nodes: list[Node]
    slots: list[Slot]
    services: Services
    telemetry: TelemetryWindow
    build_s: float
    url: str
    tmp: Path  # its SQLite file (gpubot.db) when it has one
    rules: Path


@contextmanager
def fleet(
    kind: str,
    gpus: int,
    server: postgres.PostgresServer | None,
    *,
    leases: bool = True,
    served: bool = False,
) -> Iterator[Fleet]:
    """tests.bench.sweep's fleet of `gpus` GPUs on a fresh database, its services open.

    `served`: with the garbage collector as serve keeps it (`collected_as_serve_does`) from
    the moment the database and the services are ready, before the telemetry is fed: serve
    freezes what its start-up built, not the readings that agents push afterwards, and its
    window holds only the minutes not yet rolled into the history (the feed's hours of idle
    samples left 1.2 million of them at 100,000 GPUs, which serve's full collections would
    never have had to walk)."""
    rng = random.Random(gpus)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-scale-") as name, ExitStack() as stack:
        tmp = Path(name)
        nodes = plan_nodes(gpus)
        url = stack.enter_context(database(kind, tmp, server))
        db = Database(url)
        stack.callback(db.dispose)
        insert_inventory(db, nodes)
        rules = rules_dir(tmp, nodes)
        org = rules / "org.yaml"
        text = org.read_text(encoding="utf-8")
        text = text.replace(
            "members: [U0ALICE01, U0BOB0001]", f"members: [U0ALICE01, U0BOB0001, {TYPIST}]"
        )
        org.write_text(text, encoding="utf-8")
        sources = read_rules_dir(rules)
        services = Services.open(db, sources, clock=lambda: NOW)
        stack.callback(services.close)
        slots = insert_leases(db, nodes, rng) if leases else []
        if served:
            stack.enter_context(collected_as_serve_does())
        telemetry = TelemetryWindow(services.policy.timing.stale_after, expected_interval=INTERVAL)
        feed(telemetry, slots, rng)
        if served:  # serve's sweep job rolls each minute that is over into the history
            telemetry.minute_rollups(NOW)
        took = time.perf_counter() - started
        yield Fleet(kind, gpus, nodes, slots, services, telemetry, took, url, tmp, rules)


# ---- the sweep --------------------------------------------------------------------------


@dataclass
class Sweep:
    first_s: float
    best_s: float
    decided: int
    evaluated: int
    delivered: int
    profile: list[tuple[str, float]] = field(default_factory=list)
    cpu_s: float = math.nan  # the least CPU time of the steady passes (the machine is shared)
    first_cpu_s: float = math.nan
    actions: int = 0  # what the first pass did: warnings, reclaims, notices, would-haves

    @property
    def per_action_ms(self) -> tuple[float, float]:
        """The first pass's wall and CPU milliseconds per action."""
        n = max(self.actions, 1)
        return self.first_s * 1000 / n, self.first_cpu_s * 1000 / n


def bench_sweep(f: Fleet, *, profile: bool = False, committed: bool = False) -> Sweep:
    services, telemetry = f.services, f.telemetry
    t0, c0 = time.perf_counter(), time.process_time()
    # The first pass warns a tenth of the leases: at 100,000 GPUs, some 16,000 actions. As one
    # unit of work (each action a savepoint of one transaction) it builds the steady state in
    # a fraction of the time a commit per action takes; the steady passes are timed as served.
    # `committed`: the first pass as serve runs it after downtime, a transaction per action.
    if committed:
        first = services.sweep(telemetry)
    else:
        with services.db.unit():
            first = services.sweep(telemetry)
    first_s, first_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    actions = sum(
        len(done) for done in (first.warned, first.reclaimed, first.notified, first.would_have)
    )
    delivered = deliver_all(services.db)
    services.sweep(telemetry)  # the warnings now stand delivered: settle once more
    best = cpu = math.inf
    report = None
    for _ in range(RUNS):
        t0, c0 = time.perf_counter(), time.process_time()
        report = services.sweep(telemetry)
        best = min(best, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    assert report is not None
    top = hot_spots(lambda: services.sweep(telemetry)) if profile else []
    return Sweep(
        first_s, best, report.decided, report.evaluated, delivered, top, cpu, first_cpu_s, actions
    )


def hot_spots(run: Callable[[], object], limit: int = 12) -> list[tuple[str, float]]:
    """The functions with the most time of their own in one pass (cProfile)."""
    profiler = cProfile.Profile()
    profiler.runcall(run)
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    own = sorted(
        (
            (f"{Path(file).name}:{line} {func}", tt)
            for (file, line, func), (_, _, tt, _, _) in stats.items()
        ),
        key=lambda item: -item[1],
    )
    return own[:limit]


def sweep_only(
    kinds: tuple[str, ...], fleets: tuple[int, ...], *, profile: bool, committed: bool = False
) -> int:
    """Each fleet's first and steady sweeps alone (no scrape, ingest, commands or audit): wall
    and CPU seconds, the first pass's cost per action, with the budget lines; `profile` adds
    the biggest fleet's hot spots; `committed`: the first pass commits each action."""
    print("sweeps only (wall seconds on a shared machine; cpu: this process's CPU)")
    how = "a transaction per action, as serve runs it" if committed else "one unit of work"
    print(f"first pass: {how}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    got: list[tuple[str, int, Sweep]] = []
    with ExitStack() as stack:
        server = stack.enter_context(postgres.server()) if "postgres" in kinds else None
        for kind in kinds:
            for gpus in fleets:
                print(f"  {kind}, {gpus:,} GPUs: building ...", file=sys.stderr, flush=True)
                with fleet(kind, gpus, server, served=True) as f:
                    print("    sweeping ...", file=sys.stderr, flush=True)
                    biggest = profile and gpus == fleets[-1]
                    got.append((kind, gpus, bench_sweep(f, profile=biggest, committed=committed)))
    print(
        f"  {'db':<9}{'GPUs':>8}{'1st sweep s':>12}{'cpu s':>7}{'actions':>8}{'ms/action':>10}"
        f"{'cpu ms':>7}{'sweep s':>9}{'cpu s':>7}{'decided':>9}{'evaluated':>10}"
    )
    for kind, gpus, s in got:
        wall_ms, cpu_ms = s.per_action_ms
        print(
            f"  {kind:<9}{gpus:>8,}{s.first_s:>12.2f}{s.first_cpu_s:>7.2f}{s.actions:>8,}"
            f"{wall_ms:>10.2f}{cpu_ms:>7.2f}{s.best_s:>9.3f}{s.cpu_s:>7.3f}"
            f"{s.decided:>9,}{s.evaluated:>10,}"
        )
    print()
    print(header())
    for kind in kinds:
        mine = sorted((g, s) for k, g, s in got if k == kind)
        for gpus, s in mine:
            limit = SWEEP_BUDGET_S if gpus > COMPARED else SWEEP_10K_BUDGET_S
            print(budget_line(f"{kind}: one sweep of {gpus:,} GPUs", s.best_s, limit))
        if len(mine) > 1 and mine[-1][0] > mine[0][0]:
            (few, small), (many, big) = mine[0], mine[-1]
            what = f"{kind}: sweep, {many // few}x the fleet"
            print(budget_line(what, big.best_s / small.best_s, SCALING_BUDGET, "x", below=False))
            what = f"{kind}: sweep CPU, {many // few}x the fleet"
            print(budget_line(what, big.cpu_s / small.cpu_s, SCALING_BUDGET, "x", below=False))
            # An action costs what it costs whatever the fleet: flat, within the noise.
            what = f"{kind}: first pass CPU per action, {many // few}x the fleet"
            got_x = big.per_action_ms[1] / small.per_action_ms[1]
            print(budget_line(what, got_x, ACTION_SCALING_BUDGET, "x", below=False))
    for kind, gpus, s in got:
        if s.profile:
            print()
            print(f"  where one sweep of {gpus:,} GPUs on {kind} spends its own time (cProfile)")
            for where, seconds in s.profile:
                print(f"    {seconds * 1000:>9.1f} ms  {where}")
    return 0


# ---- the /metrics scrape ----------------------------------------------------------------


def bench_scrape(f: Fleet) -> tuple[float, float] | str:
    """(a replica's first, best of RUNS later) seconds of one scrape, or why it was not
    measured."""
    got = scrape_figures(f)
    return got if isinstance(got, str) else (got.first_s, got.best_s)


@dataclass
class Scrape:
    first_ever_s: float  # the first scrape before any checkpoint (once, after the upgrade)
    first_ever_cpu_s: float
    first_s: float  # a fresh collector's first scrape from the leader's checkpoint (a replica)
    first_cpu_s: float
    best_s: float  # the best of RUNS later ones
    best_cpu_s: float
    size: int  # bytes of exposition text
    profile: list[tuple[str, float]] = field(default_factory=list)  # of a replica's first


def timed_scrape(metrics: Any, registry: Any) -> tuple[float, float, int]:
    t0, c0 = time.perf_counter(), time.process_time()
    size = len(metrics.scrape(registry))
    return time.perf_counter() - t0, time.process_time() - c0, size


def scrape_figures(f: Fleet, *, profile: bool = False) -> Scrape | str:
    """Wall and CPU seconds of: the first scrape ever (no checkpoint stored yet); then, once
    the leader's job stored its checkpoint, a fresh collector's first scrape (a replica just
    started) and the best later one; with `profile`, where another fresh collector's first
    scrape spends its time."""
    try:
        # By name: the module may land after this bench (it is then "not measured").
        metrics = importlib.import_module("bot.metrics")
    except ImportError as exc:
        return f"not measured: bot.metrics cannot be imported ({exc})"
    ever_s, ever_cpu, _ = timed_scrape(metrics, metrics.build_registry(f.services))
    metrics.store_checkpoint(f.services.db, f.services.now())
    registry = metrics.build_registry(f.services)
    first_s, first_cpu, size = timed_scrape(metrics, registry)
    best = best_cpu = math.inf
    for _ in range(RUNS):
        seconds, cpu, size = timed_scrape(metrics, registry)
        best, best_cpu = min(best, seconds), min(best_cpu, cpu)
    top = []
    if profile:
        fresh = metrics.build_registry(f.services)
        top = hot_spots(lambda: metrics.scrape(fresh), limit=16)
    return Scrape(ever_s, ever_cpu, first_s, first_cpu, best, best_cpu, size, top)


def insert_history(db: Database, leases: int, rng: random.Random) -> None:
    """`leases` ended leases over the year before NOW, each with its GPU and the request that
    asked for it (as a long-running install holds), in bulk."""
    if leases <= 0:
        return
    year_s = 365 * 86400.0
    ends = ("released", "reclaimed", "expired")
    reasons = ("expired", "idle", "preempted", "unhealthy")
    pools = [(p, "platform" if p not in ("a100", "l40s") else None) for p, *_ in POOLS]
    with db.write() as session:
        gpu_ids = [g for (g,) in session.execute(sa.select(GpuRow.__table__.c.id).limit(1000))]  # type: ignore[attr-defined]
        lease_t = LeaseRow.__table__  # type: ignore[attr-defined]
        request_t = RequestRow.__table__  # type: ignore[attr-defined]
        link_t = LeaseGpuRow.__table__  # type: ignore[attr-defined]
        first = int(
            session.execute(sa.select(sa.func.coalesce(sa.func.max(lease_t.c.id), 0))).scalar() or 0
        )
        for start in range(0, leases, 20_000):
            rows, asks, links = [], [], []
            for k in range(start, min(leases, start + 20_000)):
                pool, only = pools[k % len(pools)]
                team = only or ("vision", "nlp")[k % 2]
                granted = NOW - timedelta(seconds=rng.uniform(3600, year_s))
                ended = granted + timedelta(seconds=rng.uniform(600, 3 * 86400))
                state = ends[k % len(ends)]
                rows.append(
                    {
                        "id": first + k + 1,
                        "holder": "U0HIST0001",
                        "team": team,
                        "pool": pool,
                        "gpus": 1,
                        "priority": "normal",
                        "protected": False,
                        "reason": "history",
                        "state": state,
                        "granted_at": granted,
                        "expires_at": ended,
                        "ended_at": min(ended, NOW - timedelta(minutes=30)),
                        "end_reason": rng.choice(reasons) if state == "reclaimed" else state,
                        "extensions": 0,
                        "extended_s": 0,
                        "warnings": {},
                        "snoozes": 0,
                    }
                )
                links.append(
                    {
                        "lease_id": first + k + 1,
                        "gpu_id": gpu_ids[k % len(gpu_ids)],
                        "active": False,
                    }
                )
                asks.append(
                    {
                        "kind": "borrow",
                        "requester": "U0HIST0001",
                        "team": team,
                        "pool": pool,
                        "gpus": 1,
                        "duration_s": 3600,
                        "priority": "normal",
                        "reason": "history",
                        "state": "approved",
                        "outcome": ("approve", "ask", "queue")[k % 3],
                        "approvers": [],
                        "approval_route": "",
                        "lease_id": first + k + 1,
                        "created_at": granted,
                        "reminders": 0,
                    }
                )
            session.execute(sa.insert(lease_t), rows)
            session.execute(sa.insert(link_t), links)
            session.execute(sa.insert(request_t), asks)
        if db.url.get_backend_name() == "postgresql":
            session.execute(sa.text("SELECT setval('lease_id_seq', (SELECT max(id) FROM lease))"))


def profile_telemetry(db: Database, rng: random.Random) -> None:
    """Every GPU profiled in the last few minutes, as a running poll leaves them (the scrape
    alone reads this; the sweep's bench writes it through the real path)."""
    gpu = GpuRow.__table__  # type: ignore[attr-defined]
    with db.write() as session:
        ids = [g for (g,) in session.execute(sa.select(gpu.c.id))]
        session.execute(
            sa.update(gpu).where(gpu.c.id == sa.bindparam("gid")),
            [{"gid": g, "profiled_at": NOW - timedelta(seconds=rng.uniform(0, 300))} for g in ids],
        )


# ---- agent ingest -----------------------------------------------------------------------


@dataclass
class Ingested:
    offered: int
    rate: float  # pushes per second offered
    achieved: float  # pushes per second completed
    statuses: Counter[int]
    latencies_s: list[float]  # from each push's due instant to its answer, sorted
    cpu_s: float = math.nan  # the serving process's CPU time over the run
    how: str = "handler"  # handler, http, or http + sweeps
    sweeps: int = 0  # sweeps run meanwhile
    sweep_s: list[tuple[float, float]] = field(default_factory=list)  # each one's (wall, CPU)
    sweep_alone_s: tuple[float, float] = (math.nan, math.nan)  # one just before, no pushes
    full_gc_s: list[float] = field(default_factory=list)  # each full collection's pause

    def quantile(self, q: float) -> float:
        if not self.latencies_s:
            return math.nan
        return self.latencies_s[max(0, math.ceil(q * len(self.latencies_s)) - 1)]


@contextmanager
def full_collections() -> Iterator[list[float]]:
    """The pause of each full (generation 2) collection while the block runs: the collector
    stops every thread, so each one delays every push in flight."""
    pauses: list[float] = []
    started = [0.0]

    def note(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - started[0])

    gc.callbacks.append(note)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(note)


def push_bodies(f: Fleet, count: int, tokens: dict[str, str]) -> list[tuple[dict[str, str], bytes]]:
    """`count` signed pushes, node after node, each with its node's 8 samples taken now."""
    return signed_pushes(f.nodes, count, tokens)


def signed_pushes(
    nodes: list[Node], count: int, tokens: dict[str, str]
) -> list[tuple[dict[str, str], bytes]]:
    now = datetime.now(UTC)
    stamp = str(int(now.timestamp()))
    out = []
    for k in range(count):
        node = nodes[k % len(nodes)]
        samples: list[Sample] = [
            a_sample(Slot(node, i, None), now, 50.0, "alice" if i < PER_NODE // 2 else None)
            for i in range(PER_NODE)
        ]
        body = to_json(samples)
        nonce = secrets.token_hex(16)
        headers = {
            "X-Gpubot-Node": node.name,
            "X-Gpubot-Timestamp": stamp,
            "X-Gpubot-Nonce": nonce,
            "X-Gpubot-Signature": sign(tokens[node.name], stamp, nonce, body),
        }
        out.append((headers, body))
    return out


def an_ingest(f: Fleet, tokens: dict[str, str], window: TelemetryWindow | None = None) -> Ingest:
    """The fleet's Ingest as serve wires it, feeding `window` (else a window of its own)."""
    services = f.services
    if window is None:
        window = TelemetryWindow(services.policy.timing.stale_after, expected_interval=INTERVAL)
    return Ingest(
        tokens,
        window,
        on_refused=services.record_refused_agent,
        orders=services.take_orders,
        results=services.record_results,
        spend=services.spend_nonce,
        pending=lambda: agent_reads.nodes_with_orders(services.db),
    )


def bench_ingest(f: Fleet, seconds: float = INGEST_S) -> Ingested:
    """Pushes offered at one per node per PUSH_EVERY_S for `seconds`, open loop: each handed to
    the pool at its due instant, so a slow answer shows as latency, never as a slower sender."""
    tokens = {n.name: secrets.token_hex(16) for n in f.nodes}
    ingest = an_ingest(f, tokens)
    rate = len(f.nodes) / PUSH_EVERY_S
    count = max(1, round(rate * seconds))
    pushes = push_bodies(f, count, tokens)
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    lock = threading.Lock()

    def one(due: float, headers: dict[str, str], body: bytes) -> None:
        status, _ = ingest.handle(headers, body)
        done = time.perf_counter()
        with lock:
            statuses[status] += 1
            latencies.append(done - due)

    cpu = time.process_time()
    start = time.perf_counter() + 0.05
    with (
        full_collections() as pauses,
        ThreadPoolExecutor(INGEST_WORKERS, thread_name_prefix="ingest") as pool,
    ):
        for k, (headers, body) in enumerate(pushes):
            due = start + k / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            pool.submit(one, due, headers, body)
    took = time.perf_counter() - start
    cpu = time.process_time() - cpu
    return Ingested(count, rate, count / took, statuses, sorted(latencies), cpu, full_gc_s=pauses)


def bench_ingest_http(f: Fleet, seconds: float, *, sweeping: bool = False) -> Ingested:
    """Signed pushes over HTTP at one per node per PUSH_EVERY_S for `seconds`, from a driver
    in a separate process, to the real ASGI front on uvicorn in this one; with `sweeping`,
    sweeps of the fleet run back to back meanwhile, on a thread of this process as the
    leader's scheduler runs them, reading the window the pushes feed (as serve's sweep does)."""
    tokens = {n.name: secrets.token_hex(16) for n in f.nodes}
    ingest = an_ingest(f, tokens, f.telemetry if sweeping else None)
    app = App(signing_secret="bench", token="xoxb-bench", token_verification_enabled=False)
    front = Background(SlackAsgi(app, lambda: {"ok": True}, ingest=ingest), name="bench-http")
    rate = len(f.nodes) / PUSH_EVERY_S
    count = max(1, round(rate * seconds))
    stop = threading.Event()
    sweeps: list[tuple[float, float]] = []
    alone = (math.nan, math.nan)

    def sweep_on() -> None:
        while not stop.is_set():
            wall, cpu = time.perf_counter(), time.thread_time()
            f.services.sweep(f.telemetry)
            sweeps.append((time.perf_counter() - wall, time.thread_time() - cpu))

    sweeper = threading.Thread(target=sweep_on, name="bench-sweep", daemon=True)
    if sweeping:  # the steady state, as serve's sweep finds it minute after minute
        with f.services.db.unit():
            f.services.sweep(f.telemetry)
        deliver_all(f.services.db)
        alone = (time.perf_counter(), time.thread_time())
        f.services.sweep(f.telemetry)
        alone = (time.perf_counter() - alone[0], time.thread_time() - alone[1])
    try:
        with (
            full_collections() as pauses,
            ProcessPoolExecutor(1, mp_context=get_context("spawn")) as driver,
        ):
            # The driver signs its pushes first; the clock starts once it says it is ready.
            pending = driver.submit(drive, front.url, f.nodes, tokens, rate, count)
            cpu = time.process_time()
            if sweeping:
                sweeper.start()
            statuses, latencies, took = pending.result()
            cpu = time.process_time() - cpu
    finally:
        stop.set()
        if sweeper.is_alive():
            sweeper.join()
        front.stop()
    how = "http + sweeps" if sweeping else "http"
    return Ingested(
        count,
        rate,
        count / took,
        statuses,
        sorted(latencies),
        cpu,
        how=how,
        sweeps=len(sweeps),
        sweep_s=sweeps,
        sweep_alone_s=alone,
        full_gc_s=pauses,
    )


def drive(
    url: str, nodes: list[Node], tokens: dict[str, str], rate: float, count: int
) -> tuple[Counter[int], list[float], float]:
    """(In the driver process.) Offer `count` signed pushes at `rate` a second, open loop,
    each from a free sender thread at its due instant; (statuses, latency of each from its due
    instant, seconds from the first due instant to the last answer). Status 0: no answer."""
    pushes = signed_pushes(nodes, count, tokens)
    host, port = url.removeprefix("http://").split(":")
    local = threading.local()
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    last = 0.0

    def one(due: float, headers: dict[str, str], body: bytes) -> None:
        nonlocal last
        status = 0
        for _attempt in range(2):  # once more on a connection the server had closed
            connection = getattr(local, "connection", None)
            if connection is None:
                connection = local.connection = http.client.HTTPConnection(
                    host, int(port), timeout=HTTP_TIMEOUT_S
                )
            try:
                connection.request("POST", AGENT_PATH, body=body, headers=headers)
                answer = connection.getresponse()
                answer.read()
                status = answer.status
                break
            except (OSError, http.client.HTTPException):
                connection.close()
                local.connection = None
        done = time.perf_counter()
        with lock:
            statuses[status] += 1
            latencies.append(done - due)
            last = max(last, done)

    start = time.perf_counter() + 0.2
    with ThreadPoolExecutor(HTTP_SENDERS, thread_name_prefix="push") as pool:
        for k, (headers, body) in enumerate(pushes):
            due = start + k / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            pool.submit(one, due, headers, body)
    return statuses, latencies, last - start


# ---- commands ---------------------------------------------------------------------------


def bench_commands(f: Fleet, runs: int = COMMAND_RUNS) -> dict[str, float]:
    """Median wall seconds per command as the services answer it (see `command_times`)."""
    return {name: wall for name, (wall, _) in command_times(f, runs).items()}


#: The commands timed, in the order of one round.
COMMANDS = ("status", "admin status", "borrow", "release", "mine", "why")
Timings = dict[str, tuple[float, float]]  # median (wall, CPU) seconds per command


def command_times(f: Fleet, runs: int = COMMAND_RUNS) -> Timings:
    """Median (wall, CPU) seconds per command as the services answer it: status (and as an
    admin sees it), borrow (approved at once), mine, why (of that lease), release (it). CPU is
    this process's (on PostgreSQL the server's share is not in it)."""
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in COMMANDS}
    for _ in range(runs):
        command_round(f, times)
    return medians(times)


def command_round(f: Fleet, times: dict[str, list[tuple[float, float]]]) -> None:
    """Each command once, its (wall, CPU) seconds appended to `times`."""
    services = f.services

    def timed(name: str, call: Callable[[], Any]) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        out = call()
        times[name].append((time.perf_counter() - t0, time.process_time() - c0))
        return out

    ask = BorrowAsk(pool="a100", gpus=1, duration=timedelta(hours=2), reason="bench")
    timed("status", services.status)
    # what an admin's status reads besides: the GPUs used without a lease, or by someone else
    timed("admin status", lambda: (services.status(), services.unreserved(), services.intrusions()))
    got = timed("borrow", lambda: services.borrow(TYPIST, ask))
    assert not isinstance(got, Refused), got
    mine = timed("mine", lambda: services.leases(TYPIST))
    assert got.lease is not None, got  # approved at once: inside the team's nominal
    lease = got.lease.id
    timed("why", partial(services.why, TYPIST, f"L{lease}"))
    timed("release", partial(services.release, TYPIST, lease))
    assert len(mine) == 1, mine


def medians(times: dict[str, list[tuple[float, float]]]) -> Timings:
    return {
        name: (
            statistics.median(w for w, _ in ts) if ts else math.nan,
            statistics.median(c for _, c in ts) if ts else math.nan,
        )
        for name, ts in times.items()
    }


def statuses(services: Services, runs: int) -> None:
    for _ in range(runs):
        services.status()


def commands_only(
    kinds: tuple[str, ...], small: int, compared: int, *, runs: int, profile: bool
) -> int:
    """The commands alone (no sweep, scrape, ingest, serve or audit) on the small fleet and the
    compared one: median wall and CPU seconds each, and their ratios against the budget;
    `profile` adds where `/gpu status` spends its time on each fleet."""
    print(f"commands only, median of {runs} (wall seconds on a shared machine; cpu: this process)")
    print()
    got: dict[tuple[str, int], Timings] = {}
    spots: dict[tuple[str, int], list[tuple[str, float]]] = {}
    with ExitStack() as stack:
        server = stack.enter_context(postgres.server()) if "postgres" in kinds else None
        for kind in kinds:
            for gpus, (times, where) in side_by_side(
                kind, (small, compared), server, runs=runs, profile=profile
            ).items():
                got[kind, gpus] = times
                if where:
                    spots[kind, gpus] = where
    print_side_by_side(kinds, got, small, compared)
    for (kind, gpus), where in spots.items():
        print()
        print(f"  where {runs} status answers on {kind} with {gpus:,} GPUs spend their time")
        for place, seconds in where:
            print(f"    {seconds * 1000:>9.1f} ms  {place}")
    return 0


def side_by_side(
    kind: str,
    sizes: tuple[int, ...],
    server: postgres.PostgresServer | None,
    *,
    runs: int,
    profile: bool,
) -> dict[int, tuple[Timings, list[tuple[str, float]]]]:
    """The commands on fleets of each size, open together and timed round by round, one fleet
    then the other, so that a shared machine's drifting load weighs on them alike."""
    with ExitStack() as fleets:
        both: dict[int, Fleet] = {}
        for gpus in sizes:
            print(f"  {kind}, {gpus:,} GPUs: building ...", file=sys.stderr, flush=True)
            both[gpus] = fleets.enter_context(fleet(kind, gpus, server))
        times: dict[int, dict[str, list[tuple[float, float]]]] = {
            gpus: {c: [] for c in COMMANDS} for gpus in both
        }
        for _ in range(runs):
            for gpus, f in both.items():
                command_round(f, times[gpus])
        return {
            gpus: (
                medians(times[gpus]),
                hot_spots(partial(statuses, f.services, runs)) if profile else [],
            )
            for gpus, f in both.items()
        }


def print_side_by_side(
    kinds: tuple[str, ...], got: dict[tuple[str, int], Timings], small: int, compared: int
) -> None:
    print(f"  {'db':<9}{'command':<13}{'GPUs':>8}{'wall ms':>9}{'cpu ms':>8}")
    for (kind, gpus), times in got.items():
        for name, (wall, cpu) in times.items():
            print(f"  {kind:<9}{name:<13}{gpus:>8,}{wall * 1000:>9.2f}{cpu * 1000:>8.2f}")
    print()
    print(header())
    for kind in kinds:
        few, many = got[kind, small], got[kind, compared]
        for name in few:
            (wall_a, cpu_a), (wall_b, cpu_b) = few[name], many[name]
            what = f"{kind}: {name} wall {wall_b * 1000:.1f} ms vs {wall_a * 1000:.1f} ms"
            print(budget_line(what, wall_b / wall_a, COMMAND_BUDGET, "x", below=False))
            what = f"{kind}: {name} cpu {cpu_b * 1000:.1f} ms vs {cpu_a * 1000:.1f} ms"
            ratio = cpu_b / cpu_a if cpu_a else math.nan
            print(budget_line(what, ratio, COMMAND_BUDGET, "x", below=False))


# ---- audit ------------------------------------------------------------------------------


def bench_audit(url: str, rows: int) -> dict[str, float] | str:
    try:
        audit_scale = importlib.import_module("tests.bench.audit_scale")
    except ImportError as exc:
        return f"not measured: tests.bench.audit_scale cannot be imported ({exc})"
    figures: dict[str, float] = audit_scale.measure(url, rows=rows)
    return figures


# ---- printing ---------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def budget_line(
    what: str,
    ours: float,
    budget: float,
    unit: str = "s",
    *,
    below: bool = True,
    floor: bool = False,
) -> str:
    """One figure: ours, the budget and their ratio (under 1 is inside a ceiling; with
    `floor`, the budget is a least and a ratio of 1 or more meets it)."""
    ceiling = ours < budget if below else ours <= budget
    ok = ours >= budget if floor else ceiling
    shown = f"{ours:.3f} {unit}" if unit == "s" else f"{ours:.2f}{unit}"
    limit = f"{budget:g} {unit}" if unit == "s" else f"{budget:g}{unit}"
    ratio = ours / budget if budget else math.nan
    return f"  {what:<50}{shown:>12}{limit:>10}{ratio:>8.2f}  {verdict(ok)}"


def header() -> str:
    return f"  {'':<50}{'ours':>12}{'budget':>10}{'ratio':>8}"


@dataclass
class Row:
    kind: str
    gpus: int
    nodes: int
    build_s: float
    sweep: Sweep
    scrape: tuple[float, float] | str
    ingest: Ingested
    commands: dict[str, float] | None = None  # median seconds per command
    rss: scale_rss.Rss | None = None  # a serve process on this fleet's database


def measure_fleet(
    kind: str,
    gpus: int,
    server: postgres.PostgresServer | None,
    *,
    profile: bool = False,
    commands: bool = False,
    ingest_s: float = INGEST_S,
    command_runs: int = COMMAND_RUNS,
    rss_burst: int = 0,
) -> Row:
    print(f"  {kind}, {gpus:,} GPUs: building ...", file=sys.stderr, flush=True)
    with fleet(kind, gpus, server, served=True) as f:
        print(f"    built in {f.build_s:.1f} s; sweeping ...", file=sys.stderr, flush=True)
        sweep = bench_sweep(f, profile=profile)
        scrape = bench_scrape(f)
        print("    ingest ...", file=sys.stderr, flush=True)
        ingest = bench_ingest(f, ingest_s)
        if commands:
            print("    commands ...", file=sys.stderr, flush=True)
        typed = bench_commands(f, command_runs) if commands else None
        rss = None
        if rss_burst and kind == "sqlite":
            print(f"    serve, {rss_burst} commands ...", file=sys.stderr, flush=True)
            rss = scale_rss.measure(f.tmp / "gpubot.db", f.rules, burst=rss_burst)
    return Row(kind, gpus, len(f.nodes), f.build_s, sweep, scrape, ingest, typed, rss)


def print_rows(rows: list[Row]) -> None:
    print(
        f"  {'db':<9}{'GPUs':>8}{'nodes':>7}{'build s':>9}{'1st sweep s':>12}{'sweep s':>9}"
        f"{'decided':>9}{'evaluated':>10}{'scrape s':>9}{'push/s':>8}{'p50 ms':>8}{'p99 ms':>8}"
    )
    for r in rows:
        scrape = f"{r.scrape[1]:.3f}" if isinstance(r.scrape, tuple) else "-"
        print(
            f"  {r.kind:<9}{r.gpus:>8,}{r.nodes:>7,}{r.build_s:>9.1f}{r.sweep.first_s:>12.2f}"
            f"{r.sweep.best_s:>9.3f}{r.sweep.decided:>9,}{r.sweep.evaluated:>10,}{scrape:>9}"
            f"{r.ingest.achieved:>8.0f}{r.ingest.quantile(0.5) * 1000:>8.1f}"
            f"{r.ingest.quantile(0.99) * 1000:>8.1f}"
        )
    for r in rows:
        print(f"  {r.kind} {r.gpus:,} GPUs: steady sweep CPU time {r.sweep.cpu_s:.3f} s")
    for r in rows:
        if isinstance(r.scrape, str):
            print(f"  {r.kind} {r.gpus:,} GPUs scrape: {r.scrape}")
        bad = {s: n for s, n in r.ingest.statuses.items() if s != 200}
        if bad:
            print(f"  {r.kind} {r.gpus:,} GPUs ingest answers other than 200: {bad}")


def print_budgets(rows: list[Row]) -> None:
    print(header())
    for kind in KINDS:
        mine = sorted((r for r in rows if r.kind == kind), key=lambda r: r.gpus)
        if not mine:
            continue
        small, big = mine[0], mine[-1]
        print(
            budget_line(
                f"{kind}: one sweep of {big.gpus:,} GPUs",
                big.sweep.best_s,
                SWEEP_BUDGET_S if big.gpus > COMPARED else SWEEP_10K_BUDGET_S,
            )
        )
        if isinstance(big.scrape, tuple):
            print(
                budget_line(
                    f"{kind}: one scrape, {big.gpus:,} GPUs (a replica's first)",
                    big.scrape[0],
                    SCRAPE_BUDGET_S,
                )
            )
        p99 = big.ingest.quantile(0.99)
        print(
            budget_line(
                f"{kind}: ingest p99 at {big.ingest.rate:.0f} pushes/s", p99, INGEST_P99_BUDGET_S
            )
        )
        kept = big.ingest.achieved / big.ingest.rate
        what = f"{kind}: ingest sustained (achieved / offered rate)"
        print(budget_line(what, kept, KEPT_UP, "x", floor=True))
        if big.gpus > small.gpus:
            scale = big.gpus // small.gpus
            for what, a, b in (
                ("sweep", small.sweep.best_s, big.sweep.best_s),
                (
                    "scrape",
                    small.scrape[1] if isinstance(small.scrape, tuple) else math.nan,
                    big.scrape[1] if isinstance(big.scrape, tuple) else math.nan,
                ),
            ):
                if math.isnan(a) or math.isnan(b):
                    continue
                print(
                    budget_line(
                        f"{kind}: {what}, {scale}x the fleet",
                        b / a,
                        SCALING_BUDGET,
                        "x",
                        below=False,
                    )
                )


def print_commands(
    kind: str, small: dict[str, float], big: dict[str, float], *, gpus: int, few: int, runs: int
) -> None:
    print(f"  {kind}: each command's median of {runs}, {few:,} GPUs and {gpus:,} GPUs")
    print(header())
    for name, base in small.items():
        ratio = big[name] / base if base else math.nan
        what = f"{kind}: {name} {big[name] * 1000:.1f} ms vs {base * 1000:.1f} ms"
        print(budget_line(what, ratio, COMMAND_BUDGET, "x", below=False))


def print_audit(kind: str, got: dict[str, float] | str) -> None:
    if isinstance(got, str):
        print(f"  {kind}: audit verify / export: {got}")
        return
    rows = int(got.get("rows", 0))
    print(f"  {kind}: audit over {rows:,} rows")
    for name in ("verify", "export"):
        print(budget_line(f"{kind}: audit {name}", got[f"{name}_s"], AUDIT_BUDGET_S))
        print(budget_line(f"{kind}: audit {name} RSS", got[f"{name}_rss_mb"], RSS_BUDGET_MB, " MB"))


def print_rss(rows: list[Row]) -> None:
    for r in rows:
        if r.rss is None:
            continue
        got = r.rss
        print(
            f"  {r.kind}: gpubot serve on {r.gpus:,} GPUs, {got.sent} commands from "
            f"{scale_rss.CLIENTS} senders (acks: {got.acked()}; {got.answered} answered in "
            f"{scale_rss.ANSWER_S:g} s)"
        )
        print(header())
        print(budget_line("RSS once started", got.started_mb, RSS_BUDGET_MB, " MB"))
        print(budget_line("RSS at the burst's peak", got.peak_mb, RSS_BUDGET_MB, " MB"))
        quiet = f"RSS {scale_rss.QUIET_S:g} s after the burst"
        print(budget_line(quiet, got.after_mb, RSS_BUDGET_MB, " MB"))


def print_profile(rows: list[Row]) -> None:
    for r in rows:
        if not r.sweep.profile:
            continue
        print(f"  where one sweep of {r.gpus:,} GPUs on {r.kind} spends its own time (cProfile)")
        for where, seconds in r.sweep.profile:
            print(f"    {seconds * 1000:>9.1f} ms  {where}")


def print_ingest(kind: str, gpus: int, runs: list[Ingested]) -> None:
    print(f"  {kind}, {gpus:,} GPUs ({gpus // PER_NODE:,} nodes): agent ingest")
    print(
        f"    {'how':<15}{'pushes':>8}{'offered/s':>10}{'achieved/s':>11}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'max ms':>8}{'CPU ms/push':>12}{'sweeps':>7}{'full GCs':>9}"
        f"{'worst GC ms':>12}"
    )
    for r in runs:
        worst = r.latencies_s[-1] * 1000 if r.latencies_s else math.nan
        print(
            f"    {r.how:<15}{r.offered:>8,}{r.rate:>10.0f}{r.achieved:>11.0f}"
            f"{r.quantile(0.5) * 1000:>8.1f}{r.quantile(0.99) * 1000:>8.1f}{worst:>8.0f}"
            f"{r.cpu_s / r.offered * 1000:>12.2f}{r.sweeps:>7}{len(r.full_gc_s):>9}"
            f"{max(r.full_gc_s, default=0.0) * 1000:>12.0f}"
        )
    for r in runs:
        if r.sweep_s:
            walls, cpus = zip(*r.sweep_s, strict=True)
            print(
                f"    the sweeps meanwhile: median {statistics.median(walls):.2f} s wall, "
                f"{statistics.median(cpus):.2f} s CPU (their thread), {r.sweeps} in all; "
                f"one alone before: {r.sweep_alone_s[0]:.2f} s wall, {r.sweep_alone_s[1]:.2f} s CPU"
            )
    print(header())
    for r in runs:
        what = f"{kind}: {r.how}, p99 at {r.rate:.0f} pushes/s"
        print(budget_line(what, r.quantile(0.99), INGEST_P99_BUDGET_S))
        what = f"{kind}: {r.how}, achieved / offered rate"
        print(budget_line(what, r.achieved / r.rate, KEPT_UP, "x", floor=True))
    for r in runs:
        bad = {s: n for s, n in r.statuses.items() if s != 200}
        if bad:
            print(f"  {kind} {gpus:,} GPUs {r.how}: answers other than 200: {bad}")


INGEST_WAYS = ("handler", "http", "http + sweeps")


@contextmanager
def collected_as_serve_does() -> Iterator[None]:
    """As serve does once started: what start-up built is out of the collector's way (what
    comes after is not), and full collections come on serve's schedule."""
    gc.collect()
    gc.freeze()
    memory.schedule_collector()
    try:
        yield
    finally:
        memory.unschedule_collector()
        gc.unfreeze()


def ingest_ways(f: Fleet, seconds: float, ways: tuple[str, ...]) -> list[Ingested]:
    runs = []
    for how in ways:
        print(f"    ingest, {how} ...", file=sys.stderr, flush=True)
        if how == "handler":
            runs.append(bench_ingest(f, seconds))
        else:
            runs.append(bench_ingest_http(f, seconds, sweeping=how != "http"))
    return runs


def ingest_only(
    fleets: tuple[int, ...],
    kinds: tuple[str, ...],
    seconds: float,
    ways: tuple[str, ...] = INGEST_WAYS,
) -> int:
    """Agent ingest alone on each fleet and database, each of `ways`: in-process, over HTTP,
    and over HTTP while sweeps run. Each fleet's figures print as soon as they are in."""
    py = platform.python_version()
    print(f"gpubot ingest benchmark: Python {py} on {platform.machine()}, {platform.system()}")
    print(
        f"fleets {', '.join(f'{n:,}' for n in fleets)} GPUs ({PER_NODE} per node) "
        f"on {', '.join(kinds)}; one push of {PER_NODE} samples per node per "
        f"{PUSH_EVERY_S:g} s, {seconds:g} s each"
    )
    with ExitStack() as stack:
        server = stack.enter_context(postgres.server()) if "postgres" in kinds else None
        for kind in kinds:
            for gpus in fleets:
                print(f"  {kind}, {gpus:,} GPUs: building ...", file=sys.stderr, flush=True)
                with fleet(kind, gpus, server, leases="http + sweeps" in ways, served=True) as f:
                    runs = ingest_ways(f, seconds, ways)
                print()
                print_ingest(kind, gpus, runs)
                sys.stdout.flush()
    return 0


def scrape_only(
    kinds: tuple[str, ...], fleets: tuple[int, ...], *, history: int, profile: bool
) -> int:
    """Each fleet's scrapes alone: every GPU freshly profiled, `history` ended leases behind."""
    print(f"/metrics scrapes only, {history:,} ended leases and requests of history")
    print("(wall seconds on a shared machine; cpu: this process's CPU seconds)")
    print()
    got: list[tuple[str, int, Scrape | str]] = []
    with ExitStack() as stack:
        server = stack.enter_context(postgres.server()) if "postgres" in kinds else None
        for kind in kinds:
            for gpus in fleets:
                print(f"  {kind}, {gpus:,} GPUs: building ...", file=sys.stderr, flush=True)
                with fleet(kind, gpus, server) as f:
                    rng = random.Random(gpus)
                    insert_history(f.services.db, history, rng)
                    profile_telemetry(f.services.db, rng)
                    settle(f.services.db)
                    print("    scraping ...", file=sys.stderr, flush=True)
                    got.append((kind, gpus, scrape_figures(f, profile=profile)))
    print_scrapes(got)
    return 0


def settle(db: Database) -> None:
    """The database as a long-used install holds its history: on PostgreSQL vacuumed and
    analyzed, as autovacuum leaves it long before a year of rows is in (a year written in
    seconds has no statistics yet, and the planner takes 200,000 rows for one). SQLite keeps
    no statistics unless ANALYZE runs, which the bot never does."""
    if db.dialect != "postgresql":
        return
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("VACUUM ANALYZE")


def print_scrapes(got: list[tuple[str, int, Scrape | str]]) -> None:
    print(
        f"  {'db':<9}{'GPUs':>8}{'1st ever s':>11}{'cpu s':>7}{'replica 1st s':>14}{'cpu s':>7}"
        f"{'later s':>9}{'cpu s':>7}{'KiB':>6}"
    )
    for kind, gpus, s in got:
        if isinstance(s, str):
            print(f"  {kind:<9}{gpus:>8,}  {s}")
            continue
        print(
            f"  {kind:<9}{gpus:>8,}{s.first_ever_s:>11.3f}{s.first_ever_cpu_s:>7.3f}"
            f"{s.first_s:>14.3f}{s.first_cpu_s:>7.3f}{s.best_s:>9.3f}{s.best_cpu_s:>7.3f}"
            f"{s.size / 1024:>6.0f}"
        )
    print()
    print(header())
    for kind, gpus, s in got:
        if isinstance(s, str):
            continue
        for what, seconds in (
            ("first scrape ever", s.first_ever_s),
            ("a replica's first scrape", s.first_s),
            ("later scrape", s.best_s),
        ):
            print(budget_line(f"{kind}: {what}, {gpus:,} GPUs", seconds, SCRAPE_BUDGET_S))
    for kind, gpus, s in got:
        if isinstance(s, str) or not s.profile:
            continue
        print()
        print(f"  where a first scrape of {gpus:,} GPUs on {kind} spends its own time (cProfile)")
        for where, seconds in s.profile:
            print(f"    {seconds * 1000:>9.1f} ms  {where}")


# ---- running it -------------------------------------------------------------------------


def scrape_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scrape-only",
        action="store_true",
        help="time only /metrics scrapes (a fresh collector's first, then later ones)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=HISTORY,
        help="ended leases (and their requests) behind a --scrape-only fleet",
    )


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.scale")
    parser.add_argument("--quick", action="store_true", help="1,000 and 10,000 GPUs only")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--sqlite-only", action="store_true")
    only.add_argument("--postgres-only", action="store_true")
    parser.add_argument("--profile", action="store_true", help="profile the biggest sweep")
    parser.add_argument(
        "--sweep-only", action="store_true", help="time only the steady sweeps (wall and CPU)"
    )
    parser.add_argument(
        "--first-committed",
        action="store_true",
        help="with --sweep-only: the first pass commits each action, as serve runs it",
    )
    parser.add_argument("--fleets", type=int, nargs="+", help="fleet sizes (GPUs) instead")
    parser.add_argument("--small", type=int, default=SMALL, help="the commands' small fleet")
    parser.add_argument(
        "--compared", type=int, default=COMPARED, help="the fleet the commands are timed on"
    )
    parser.add_argument(
        "--ingest-s",
        type=float,
        help=f"seconds of pushes ({INGEST_S:g}; with --ingest-only {INGEST_ONLY_S:g})",
    )
    parser.add_argument(
        "--ingest-only",
        action="store_true",
        help="ingest alone: in-process, over HTTP from a driver process, and over HTTP while "
        "sweeps run",
    )
    parser.add_argument(
        "--ways",
        nargs="+",
        choices=("handler", "http", "sweeps"),
        default=["handler", "http", "sweeps"],
        help="with --ingest-only: which of the three",
    )
    parser.add_argument("--command-runs", type=int, default=COMMAND_RUNS)
    parser.add_argument(
        "--commands-only",
        action="store_true",
        help="time only the commands, on --small and --compared GPUs (wall and CPU)",
    )
    parser.add_argument(
        "--rss-burst", type=int, default=RSS_BURST, help="commands to serve (0: not measured)"
    )
    parser.add_argument("--audit-rows", type=int, default=AUDIT_ROWS)
    parser.add_argument("--no-audit", action="store_true")
    scrape_flags(parser)
    return parser.parse_args(argv)


def one_part(args: argparse.Namespace, kinds: tuple[str, ...], fleets: tuple[int, ...]) -> int:
    """The run of one --*-only flag."""
    if args.sweep_only:
        return sweep_only(kinds, fleets, profile=args.profile, committed=args.first_committed)
    if args.scrape_only:
        return scrape_only(kinds, fleets, history=args.history, profile=args.profile)
    if args.commands_only:
        return commands_only(
            kinds, args.small, args.compared, runs=args.command_runs, profile=args.profile
        )
    if args.ingest_only:
        ways = tuple(INGEST_WAYS[["handler", "http", "sweeps"].index(w)] for w in args.ways)
        return ingest_only(fleets, kinds, args.ingest_s or INGEST_ONLY_S, ways)
    raise AssertionError("no --*-only flag given")


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    fleets = tuple(args.fleets or (QUICK if args.quick else FLEETS))
    kinds = ("sqlite",) if args.sqlite_only else ("postgres",) if args.postgres_only else KINDS
    if args.sweep_only or args.scrape_only or args.ingest_only or args.commands_only:
        return one_part(args, kinds, fleets)
    ingest_s = args.ingest_s or INGEST_S
    py = platform.python_version()
    print(f"gpubot scale benchmark: Python {py} on {platform.machine()}, {platform.system()}")
    print(
        f"fleets {', '.join(f'{n:,}' for n in fleets)} GPUs ({PER_NODE} per node) "
        f"on {', '.join(kinds)}"
    )
    print()
    rows: list[Row] = []
    commands: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    audits: dict[str, dict[str, float] | str] = {}
    with ExitStack() as stack:
        server = stack.enter_context(postgres.server()) if "postgres" in kinds else None
        for kind in kinds:
            for gpus in fleets:
                profile = args.profile and gpus == fleets[-1]
                rows.append(
                    measure_fleet(
                        kind,
                        gpus,
                        server,
                        profile=profile,
                        commands=gpus == args.compared,
                        ingest_s=ingest_s,
                        command_runs=args.command_runs,
                        rss_burst=args.rss_burst if gpus == args.compared else 0,
                    )
                )
            big = next((r.commands for r in rows if r.kind == kind and r.commands), None)
            if big is not None:
                print(f"  {kind}, {args.small:,} GPUs: commands ...", file=sys.stderr, flush=True)
                with fleet(kind, args.small, server) as f:
                    commands[kind] = (bench_commands(f, args.command_runs), big)
            if not args.no_audit:
                print(f"  {kind}: audit ...", file=sys.stderr, flush=True)
                with (
                    tempfile.TemporaryDirectory(prefix="gpubot-bench-audit-") as name,
                    database(kind, Path(name), server) as url,
                ):
                    audits[kind] = bench_audit(url, args.audit_rows)
    print()
    print_rows(rows)
    print()
    print_budgets(rows)
    for kind, (small, big) in commands.items():
        print()
        print_commands(kind, small, big, gpus=args.compared, few=args.small, runs=args.command_runs)
    if any(r.rss for r in rows):
        print()
        print_rss(rows)
    for kind, got in audits.items():
        print()
        print_audit(kind, got)
    print()
    print_profile(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
