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
(--quick: 1,000 and 10,000 GPUs).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import math
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
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bot.services import BorrowAsk, Refused, Services
from bot.services.rule_files import read_rules_dir
from bot.telemetry.agent_push import Ingest
from bot.telemetry.model import Sample, sign, to_json
from bot.telemetry.window import TelemetryWindow
from storage import agent_reads, migrate
from storage.db import Database
from storage.tables import GpuRow, NodeRow, PoolRow
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
COMMAND_BUDGET = 1.5  # a command with 10,000 GPUs against the same with 100
AUDIT_BUDGET_S = 10.0
AUDIT_ROWS = 1_000_000
RSS_BUDGET_MB = 300.0
RSS_BURST = 200  # commands at serve, one per sender
RUNS = 3  # steady sweeps and scrapes: the best of this many
PUSH_EVERY_S = 30.0  # one push per node this often
INGEST_S = 10.0  # how long ingest is offered
INGEST_WORKERS = 6  # asyncio.to_thread's default pool on 2 cores: min(32, cores + 4)
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
    kind: str, gpus: int, server: postgres.PostgresServer | None, *, leases: bool = True
) -> Iterator[Fleet]:
    """tests.bench.sweep's fleet of `gpus` GPUs on a fresh database, its services open."""
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
        telemetry = TelemetryWindow(services.policy.timing.stale_after, expected_interval=INTERVAL)
        feed(telemetry, slots, rng)
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


def bench_sweep(f: Fleet, *, profile: bool = False) -> Sweep:
    services, telemetry = f.services, f.telemetry
    t0 = time.perf_counter()
    # The first pass warns a tenth of the leases: at 100,000 GPUs, some 16,000 actions. As one
    # unit of work (each action a savepoint of one transaction) it builds the steady state in
    # a fraction of the time a commit per action takes; the steady passes are timed as served.
    with services.db.unit():
        services.sweep(telemetry)
    first_s = time.perf_counter() - t0
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
    return Sweep(first_s, best, report.decided, report.evaluated, delivered, top, cpu)


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


# ---- the /metrics scrape ----------------------------------------------------------------


def bench_scrape(f: Fleet) -> tuple[float, float] | str:
    """(first, best of RUNS) seconds of one scrape, or why it was not measured."""
    try:
        # By name: the module may land after this bench (it is then "not measured").
        metrics = importlib.import_module("bot.metrics")
    except ImportError as exc:
        return f"not measured: bot.metrics cannot be imported ({exc})"
    registry = metrics.build_registry(f.services)
    first = best = math.inf
    for run in range(RUNS):
        t0 = time.perf_counter()
        metrics.scrape(registry)
        seconds = time.perf_counter() - t0
        first, best = (seconds if run == 0 else first), min(best, seconds)
    return first, best


# ---- agent ingest -----------------------------------------------------------------------


@dataclass
class Ingested:
    offered: int
    rate: float  # pushes per second offered
    achieved: float  # pushes per second completed
    statuses: Counter[int]
    latencies_s: list[float]  # from each push's due instant to its answer, sorted

    def quantile(self, q: float) -> float:
        if not self.latencies_s:
            return math.nan
        return self.latencies_s[max(0, math.ceil(q * len(self.latencies_s)) - 1)]


def push_bodies(f: Fleet, count: int, tokens: dict[str, str]) -> list[tuple[dict[str, str], bytes]]:
    """`count` signed pushes, node after node, each with its node's 8 samples taken now."""
    now = datetime.now(UTC)
    stamp = str(int(now.timestamp()))
    out = []
    for k in range(count):
        node = f.nodes[k % len(f.nodes)]
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


def bench_ingest(f: Fleet, seconds: float = INGEST_S) -> Ingested:
    """Pushes offered at one per node per PUSH_EVERY_S for `seconds`, open loop: each handed to
    the pool at its due instant, so a slow answer shows as latency, never as a slower sender."""
    services = f.services
    tokens = {n.name: secrets.token_hex(16) for n in f.nodes}
    window = TelemetryWindow(services.policy.timing.stale_after, expected_interval=INTERVAL)
    ingest = Ingest(
        tokens,
        window,
        on_refused=services.record_refused_agent,
        orders=services.take_orders,
        results=services.record_results,
        spend=services.spend_nonce,
        pending=lambda: agent_reads.nodes_with_orders(services.db),  # as serve wires it
    )
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

    start = time.perf_counter() + 0.05
    with ThreadPoolExecutor(INGEST_WORKERS, thread_name_prefix="ingest") as pool:
        for k, (headers, body) in enumerate(pushes):
            due = start + k / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            pool.submit(one, due, headers, body)
    took = time.perf_counter() - start
    return Ingested(count, rate, count / took, statuses, sorted(latencies))


# ---- commands ---------------------------------------------------------------------------


def bench_commands(f: Fleet, runs: int = COMMAND_RUNS) -> dict[str, float]:
    """Median seconds per command as the services answer it: status, borrow (approved at
    once), mine, why (of that lease), release (it)."""
    services = f.services
    times: dict[str, list[float]] = {c: [] for c in ("status", "borrow", "release", "mine", "why")}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = call()
        times[name].append(time.perf_counter() - t0)
        return out

    ask = BorrowAsk(pool="a100", gpus=1, duration=timedelta(hours=2), reason="bench")
    for _ in range(runs):
        timed("status", services.status)
        got = timed("borrow", lambda: services.borrow(TYPIST, ask))
        assert not isinstance(got, Refused), got
        mine = timed("mine", lambda: services.leases(TYPIST))
        assert got.lease is not None, got  # approved at once: inside the team's nominal
        lease = got.lease.id
        timed("why", partial(services.why, TYPIST, f"L{lease}"))
        timed("release", partial(services.release, TYPIST, lease))
        assert len(mine) == 1, mine
    return {name: statistics.median(ts) if ts else math.nan for name, ts in times.items()}


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
    with fleet(kind, gpus, server) as f:
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
                    f"{kind}: one scrape, {big.gpus:,} GPUs (first)", big.scrape[0], SCRAPE_BUDGET_S
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
            f"{scale_rss.CLIENTS} senders ({got.answered} answered in {scale_rss.ANSWER_S:g} s)"
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


# ---- running it -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.scale")
    parser.add_argument("--quick", action="store_true", help="1,000 and 10,000 GPUs only")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--sqlite-only", action="store_true")
    only.add_argument("--postgres-only", action="store_true")
    parser.add_argument("--profile", action="store_true", help="profile the biggest sweep")
    parser.add_argument("--fleets", type=int, nargs="+", help="fleet sizes (GPUs) instead")
    parser.add_argument("--small", type=int, default=SMALL, help="the commands' small fleet")
    parser.add_argument(
        "--compared", type=int, default=COMPARED, help="the fleet the commands are timed on"
    )
    parser.add_argument("--ingest-s", type=float, default=INGEST_S, help="seconds of pushes")
    parser.add_argument("--command-runs", type=int, default=COMMAND_RUNS)
    parser.add_argument(
        "--rss-burst", type=int, default=RSS_BURST, help="commands to serve (0: not measured)"
    )
    parser.add_argument("--audit-rows", type=int, default=AUDIT_ROWS)
    parser.add_argument("--no-audit", action="store_true")
    args = parser.parse_args(argv)
    fleets = tuple(args.fleets or (QUICK if args.quick else FLEETS))
    kinds = ("sqlite",) if args.sqlite_only else ("postgres",) if args.postgres_only else KINDS
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
                        ingest_s=args.ingest_s,
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
