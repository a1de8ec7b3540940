"""Benchmark: one steady-state sweep of 1,000 and of 10,000 GPUs (8 per node, half of them in
1-GPU leases: 1,250 nodes and 5,000 leases at 10k), side by side, with the budget lines.

Each fleet lives in its own SQLite file and its own rules directory (the shipped policies with
a generated pools.yaml naming the fleet's nodes; the shipped rules and cases unchanged). The
leases are inserted directly as active leases with their lease_gpu rows; a TelemetryWindow gets a
realistic mix of readings: most GPUs busy, some idle for hours, some idle for a while, a few
stale, failed or never seen, a few unhealthy, and some unreserved processes on free GPUs.
The first pass writes the one-time warnings and notices; the delivery job is then played (every
owed message delivered); the passes after that are timed, best of 3, under a fixed clock.
Run with `python -m tests.bench.sweep`. Reports figures; never fails.
"""

from __future__ import annotations

import cProfile
import platform
import pstats
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from bot.services import Services
from bot.services.rule_files import read_rules_dir
from bot.services.sweep_pass import SweepReport
from bot.telemetry.model import ProcessInfo, Sample
from bot.telemetry.window import TelemetryWindow
from rules import expr
from rules.decision import Decision
from rules.domain import LeaseState, Subject
from rules.memo import PassDecisions
from storage import migrate, outbox
from storage.db import Database
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, OutboxRow
from tests.builders import POLICIES

FLEETS = (1_000, 10_000)
PER_NODE = 8
RUNS = 3
BUDGET_S = 1.0  # one sweep of 10,000 GPUs
SCALING_BUDGET = 12.0  # 10x the fleet costs at most this many times the time
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
INTERVAL = timedelta(seconds=30)  # how often agents push

# Pools by share of the nodes; teams by share of each pool's nominal (they add up to its size).
POOLS: tuple[tuple[str, str, float, bool], ...] = (
    ("a100", "NVIDIA A100-SXM4-80GB", 0.6, False),
    ("l40s", "NVIDIA L40S", 0.3, False),
    ("inference", "NVIDIA H100 80GB HBM3", 0.1, True),
)
TEAMS = {"a100": ("vision", "nlp", "platform"), "l40s": ("vision", "nlp", "platform")}
HOLDERS = {
    "vision": (("U0ALICE01", "alice"), ("U0BOB0001", "bob")),
    "nlp": (("U0CAROL01", "carol"), ("U0DAVE001", "dave")),
    "platform": (("U0ERIN001", "erin"),),
}


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    model: str


def plan_nodes(gpus: int) -> list[Node]:
    count = gpus // PER_NODE
    nodes: list[Node] = []
    left = count
    for i, (pool, model, share, _) in enumerate(POOLS):
        n = left if i == len(POOLS) - 1 else round(count * share)
        left -= n
        nodes += [Node(f"{pool}-node-{k + 1:04d}", pool, model) for k in range(n)]
    return nodes


def pools_yaml(nodes: list[Node]) -> str:
    """pools.yaml for the fleet: every node with its 8 GPUs, nominals that add up."""
    lines = ["pools:"]
    for pool, model, _, protected in POOLS:
        mine = [n.name for n in nodes if n.pool == pool]
        size = len(mine) * PER_NODE
        lines += [f"  {pool}:", f"    model: {model}"]
        if protected:
            lines.append("    protected: true")
        lines.append("    nodes:")
        lines += [f"      {name}: {PER_NODE}" for name in mine]
        lines.append("    quotas:")
        if pool in TEAMS:
            vision = nlp = size * 2 // 5
            platform_ = size - vision - nlp
            for team, nominal in zip(TEAMS[pool], (vision, nlp, platform_), strict=True):
                lines.append(f"      {team}: {{nominal: {nominal}, borrowing_limit: 16}}")
        else:
            lines.append(
                f"      platform: {{nominal: {size}, borrowing_limit: 0, lending_limit: 0}}"
            )
    return "\n".join(lines) + "\n"


def rules_dir(tmp: Path, nodes: list[Node]) -> Path:
    """The shipped policies and their cases, with pools.yaml describing this fleet."""
    target = tmp / "rules"
    shutil.copytree(POLICIES, target)
    (target / "pools.yaml").write_text(pools_yaml(nodes), encoding="utf-8")
    return target


# ---- the fleet's leases and telemetry ---------------------------------------------------


@dataclass(frozen=True)
class Slot:
    node: Node
    index: int
    lease: tuple[str, str] | None  # (Slack user, Unix user) of the holder, None: free


def insert_leases(db: Database, nodes: list[Node], rng: random.Random) -> list[Slot]:
    """GPUs 0-3 of every node in 1-GPU leases (a100/l40s split 2:2:1 between the teams,
    inference all platform's), GPUs 4-7 free; a mix of expiry times."""
    with db.read() as session:
        ids = {
            (node, index): gpu_id
            for gpu_id, node, index in session.exec(
                select(GpuRow.id, NodeRow.name, GpuRow.index).join(
                    NodeRow, col(NodeRow.id) == col(GpuRow.node_id)
                )
            ).all()
        }
    protected = {pool: p for pool, _, _, p in POOLS}
    leases: list[dict[str, Any]] = []
    gpus: list[int] = []
    slots: list[Slot] = []
    cycle = ("vision", "nlp", "vision", "nlp", "platform")
    for k, node in enumerate(nodes):
        team = cycle[k % len(cycle)] if node.pool in TEAMS else "platform"
        for index in range(PER_NODE):
            if index >= PER_NODE // 2:
                slots.append(Slot(node, index, None))
                continue
            holder = HOLDERS[team][index % len(HOLDERS[team])]
            leases.append(
                {
                    "holder": holder[0],
                    "team": team,
                    "pool": node.pool,
                    "gpus": 1,
                    "priority": "normal",
                    "protected": protected[node.pool],
                    "reason": "bench",
                    "state": LeaseState.ACTIVE,
                    "granted_at": NOW - timedelta(minutes=rng.uniform(60, 48 * 60)),
                    "expires_at": NOW + expiry_offset(rng),
                    "end_reason": "",
                    "extensions": 0,
                    "extended_s": 0,
                    "warnings": {},
                    "snoozes": 0,
                }
            )
            gpu_id = ids[(node.name, index)]
            assert gpu_id is not None
            gpus.append(gpu_id)
            slots.append(Slot(node, index, holder))
    with db.write() as session:
        table = LeaseRow.__table__  # type: ignore[attr-defined]
        session.execute(sa.insert(table), leases)
        lease_ids = session.exec(select(LeaseRow.id).order_by(col(LeaseRow.id))).all()
        links = [
            {"lease_id": lease_id, "gpu_id": gpu_id, "active": True}
            for lease_id, gpu_id in zip(lease_ids, gpus, strict=True)
        ]
        session.execute(sa.insert(LeaseGpuRow.__table__), links)  # type: ignore[attr-defined]
    return slots


def expiry_offset(rng: random.Random) -> timedelta:
    """Mostly hours to days away; some inside a warning lead; a few already past."""
    roll = rng.random()
    if roll < 0.90:
        return timedelta(minutes=rng.uniform(3 * 60, 3 * 24 * 60))
    if roll < 0.95:
        return timedelta(minutes=rng.uniform(11, 59))
    if roll < 0.97:
        return timedelta(minutes=rng.uniform(1, 9))
    return -timedelta(minutes=rng.uniform(1, 180))


def feed(telemetry: TelemetryWindow, slots: list[Slot], rng: random.Random) -> Counter[str]:
    """One fresh sample per GPU, plus the idle stretch behind the GPUs idle for a while."""
    kinds: Counter[str] = Counter()
    for slot in slots:
        kind = leased_kind(rng) if slot.lease else free_kind(rng)
        kinds[f"{'leased' if slot.lease else 'free'} {kind}"] += 1
        telemetry.observe(samples(slot, kind, rng))
    return kinds


def leased_kind(rng: random.Random) -> str:
    roll = rng.random()
    for kind, share in (("busy", 0.80), ("idle 2-5h", 0.10), ("idle 20-60m", 0.05)):
        if roll < share:
            return kind
        roll -= share
    return rng.choice(("stale", "nvml error", "never seen", "unhealthy"))


def free_kind(rng: random.Random) -> str:
    roll = rng.random()
    for kind, share in (("free", 0.88), ("unreserved", 0.06)):
        if roll < share:
            return kind
        roll -= share
    return rng.choice(("stale", "nvml error", "never seen", "unhealthy"))


def samples(slot: Slot, kind: str, rng: random.Random) -> list[Sample]:
    last = NOW - timedelta(seconds=rng.uniform(0, 25))
    holder = slot.lease[1] if slot.lease else None  # the Unix user running the work
    if kind == "never seen":
        return []
    if kind == "stale":
        return [a_sample(slot, last - timedelta(minutes=20), 70.0, holder)]
    if kind == "nvml error":
        return [a_sample(slot, last, None, holder, error="NVMLError_Unknown")]
    if kind == "unhealthy":
        return [a_sample(slot, last, 0.0, holder, health=rng.choice(("xid", "ecc")))]
    if kind == "busy":
        return [a_sample(slot, last, rng.uniform(40, 100), holder)]
    if kind == "free":
        return [a_sample(slot, last, 0.0, None)]
    if kind == "unreserved":  # zed has no Slack account in org.yaml: only the admins hear
        user = rng.choice(("bob", "carol", "zed"))
        return [a_sample(slot, last, rng.uniform(20, 90), user)]
    idle = rng.uniform(120, 300) if kind == "idle 2-5h" else rng.uniform(20, 60)
    n = int(timedelta(minutes=idle) / INTERVAL)
    return [a_sample(slot, last - i * INTERVAL, 0.0, holder) for i in range(n, -1, -1)]


def a_sample(
    slot: Slot,
    at: datetime,
    util: float | None,
    user: str | None,
    *,
    health: str = "ok",
    error: str | None = None,
) -> Sample:
    processes = (ProcessInfo(pid=1000 + slot.index, user=user),) if user else ()
    return Sample(
        node=slot.node.name,
        index=slot.index,
        uuid=f"GPU-{slot.node.name}-{slot.index}",
        model=slot.node.model,
        memory_total_mib=81920,
        memory_used_mib=30000 if processes else 0,
        util_pct=util,
        temperature_c=45.0,
        power_w=120.0,
        health=health,
        processes=processes,
        taken_at=at,
        error=error,
    )


def deliver_all(db: Database) -> int:
    """Play the delivery job: every owed message lands now (Slack answered ok)."""
    with db.write() as session:
        rows = session.exec(select(OutboxRow).where(OutboxRow.state == outbox.PENDING)).all()
        for row in rows:
            assert row.id is not None
            outbox.delivered(session, row.id, at=NOW, channel="D0BENCH", ts="1.0")
    return len(rows)


# ---- running it -------------------------------------------------------------------------


@dataclass
class Figures:
    gpus: int
    nodes: int
    leases: int
    setup_s: float
    first_s: float
    first: SweepReport
    delivered: int
    best_s: float
    steady: SweepReport
    kinds: Counter[str]
    profile: dict[str, float]
    distinct: dict[Subject, tuple[int, int, int, int]]
    observe_first_s: float = 0.0  # the first observe: every GPU's state and profile written
    observe_s: float = 0.0  # a steady observe: telemetry shows what the database holds


def distinct_facts(
    services: Services, telemetry: TelemetryWindow
) -> dict[Subject, tuple[int, int, int, int]]:
    """Per subject, from one more pass: subjects decided, distinct whole facts (what a memo
    keyed by every fact could save), facts the conditions read, and distinct values of those."""
    live = services.ctx.live
    seen: dict[Subject, list[Mapping[str, Any]]] = {Subject.LEASE: [], Subject.GPU: []}
    acted_on = PassDecisions.acted_on  # the sweep decides through its pass's memo

    def recording(
        self: PassDecisions, subject: Subject, facts: Mapping[str, Any]
    ) -> Decision | None:
        seen[subject].append(dict(facts))
        return acted_on(self, subject, facts)

    PassDecisions.acted_on = recording  # type: ignore[method-assign]
    try:
        services.sweep(telemetry)
    finally:
        PassDecisions.acted_on = acted_on  # type: ignore[method-assign]
    out = {}
    for subject, facts in seen.items():
        read = set().union(*(expr.facts_used(r.condition) for r in live.policy.rules_for(subject)))
        whole = {tuple(sorted(f.items())) for f in facts}
        narrow = {tuple(sorted((k, v) for k, v in f.items() if k in read)) for f in facts}
        out[subject] = (len(facts), len(whole), len(read), len(narrow))
    return out


def bench_fleet(gpus: int, *, profile: bool) -> Figures:
    rng = random.Random(gpus)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-sweep-") as name:
        tmp = Path(name)
        nodes = plan_nodes(gpus)
        url = f"sqlite:///{tmp / 'gpubot.db'}"
        migrate.upgrade(url)
        db = Database(url)
        services = Services.open(db, read_rules_dir(rules_dir(tmp, nodes)), clock=lambda: NOW)
        try:
            slots = insert_leases(db, nodes, rng)
            telemetry = TelemetryWindow(
                services.policy.timing.stale_after, expected_interval=INTERVAL
            )
            kinds = feed(telemetry, slots, rng)
            setup_s = time.perf_counter() - started
            since = NOW - 4 * INTERVAL  # the bot has watched for two minutes: silence counts
            t0 = time.perf_counter()
            services.observe_fleet(telemetry, since)
            observe_first_s = time.perf_counter() - t0
            observe_s = float("inf")
            for _ in range(RUNS):
                t0 = time.perf_counter()
                services.observe_fleet(telemetry, since)
                observe_s = min(observe_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            first = services.sweep(telemetry)
            first_s = time.perf_counter() - t0
            delivered = deliver_all(db)
            services.sweep(telemetry)  # warnings now stand delivered: settle once more
            best, steady = float("inf"), SweepReport()
            for _ in range(RUNS):
                t0 = time.perf_counter()
                steady = services.sweep(telemetry)
                best = min(best, time.perf_counter() - t0)
            shares = where_time_goes(lambda: services.sweep(telemetry)) if profile else {}
            distinct = distinct_facts(services, telemetry)
        finally:
            services.close()
            db.dispose()
    return Figures(
        gpus=gpus,
        nodes=len(nodes),
        leases=sum(1 for s in slots if s.lease),
        setup_s=setup_s,
        first_s=first_s,
        first=first,
        delivered=delivered,
        best_s=best,
        steady=steady,
        kinds=kinds,
        profile=shares,
        distinct=distinct,
        observe_first_s=observe_first_s,
        observe_s=observe_s,
    )


# Where a pass spends its time: (file, function) pairs whose cumulative time makes up each part.
PARTS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "snapshot reads",
        (
            ("storage/leases.py", "active_snapshots"),
            ("storage/sweep_reads.py", "gpu_lines"),
            ("services/sweep.py", "read_snapshot"),
            ("storage/keyvalue.py", "told_unreserved"),
            ("services/admin.py", "is_paused"),
        ),
    ),
    ("telemetry readings", (("telemetry/window.py", "gpu"), ("telemetry/window.py", "readings"))),
    (
        "fact building",
        (("rules/lease_facts.py", "lease_facts"), ("rules/lease_facts.py", "gpu_line_facts")),
    ),
    ("decisions", (("rules/memo.py", "acted_on"), ("rules/memo.py", "decide"))),
    (
        "actions",
        (
            ("services/sweep.py", "_act_on_lease"),
            ("rules/reclaim.py", "lease_steps"),
            ("services/sweep.py", "act_on_lease"),
            ("services/sweep_gpus.py", "act_on_gpu"),
        ),
    ),
)


def where_time_goes(run: Callable[[], object]) -> dict[str, float]:
    """Seconds per part of one pass under cProfile (which inflates them; compare shares)."""
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.runcall(run)
    total = time.perf_counter() - t0
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    cumulative: dict[tuple[str, str], float] = {}
    for (file, _, func), (_, _, _, ct, _) in stats.items():
        path = file.replace("\\", "/")
        for part_file, part_func in (pair for _, pairs in PARTS for pair in pairs):
            if func == part_func and path.endswith(part_file):
                pair = (part_file, part_func)
                cumulative[pair] = cumulative.get(pair, 0.0) + ct
    shares = {part: sum(cumulative.get(pair, 0.0) for pair in pairs) for part, pairs in PARTS}
    shares["whole pass (profiled)"] = total
    return shares


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def describe(report: SweepReport) -> str:
    parts = [
        f"{len(report.warned)} warned",
        f"{len(report.reclaimed)} reclaimed",
        f"{len(report.notified)} notified",
        f"{len(report.would_have)} would-have",
        f"{len(report.held_back)} held back",
    ]
    return ", ".join(parts)


def print_mix(kinds: Counter[str]) -> None:
    print("  telemetry mix (GPUs):", ", ".join(f"{k} {v:,}" for k, v in sorted(kinds.items())))


def print_profile(figures: Iterable[Figures]) -> None:
    for f in figures:
        if not f.profile:
            continue
        whole = f.profile["whole pass (profiled)"]
        print(f"Where one pass of {f.gpus:,} GPUs spends its time (cProfile, inflated; shares)")
        print()
        for part, seconds in f.profile.items():
            share = seconds / whole if whole else 0.0
            print(f"  {part:<26}{seconds * 1000:>10.1f} ms{share:>8.0%}")
        print()


def main() -> int:
    py = platform.python_version()
    print(f"gpubot benchmark: Python {py} on {platform.machine()}, {platform.system()}")
    print()
    figures = [bench_fleet(n, profile=n == FLEETS[-1]) for n in FLEETS]
    print("One steady-state sweep (Services.sweep) on a SQLite file, durable engine, best of")
    print(f"{RUNS} passes after a first pass that wrote the warnings and notices")
    print()
    print("The poll job also runs an observe pass (bot.services.devices: what telemetry shows,")
    print("written where it changed); the sweep job sweeps. Both are timed: a minute runs both.")
    print()
    head = f"  {'GPUs':>7}{'nodes':>7}{'leases':>8}{'setup s':>9}{'1st pass s':>12}{'sweep s':>9}"
    print(head + f"{'1st observe s':>15}{'observe s':>11}{'both s':>8}")
    for f in figures:
        print(
            f"  {f.gpus:>7,}{f.nodes:>7,}{f.leases:>8,}{f.setup_s:>9.1f}"
            f"{f.first_s:>12.3f}{f.best_s:>9.3f}"
            f"{f.observe_first_s:>15.3f}{f.observe_s:>11.3f}{f.best_s + f.observe_s:>8.3f}"
        )
    for f in figures:
        print()
        print(f"  {f.gpus:,} GPUs:")
        print_mix(f.kinds)
        print(f"  first pass: {describe(f.first)}; then {f.delivered:,} messages delivered")
        print(f"  steady pass: {describe(f.steady)}")
        for subject, (n, whole, read, narrow) in f.distinct.items():
            print(
                f"  {subject} facts: {n:,} decided, {whole:,} distinct as whole facts; "
                f"{narrow:,} distinct in the {read} facts the conditions read"
            )
    small, big = figures[0], figures[-1]
    ratio = big.best_s / small.best_s
    print()
    print(f"  ratio 10k time / 1k time: {ratio:.2f}x (for {big.gpus // small.gpus}x the fleet)")
    print()
    print(f"  {'budget':<48}{'figure':>10}  result")
    line = f"one sweep of {big.gpus:,} GPUs under {BUDGET_S:g} s"
    print(f"  {line:<48}{f'{big.best_s:.3f} s':>10}  {verdict(big.best_s < BUDGET_S)}")
    job = big.best_s + big.observe_s
    line = f"observe + sweep of {big.gpus:,} GPUs under {BUDGET_S:g} s"
    print(f"  {line:<48}{f'{job:.3f} s':>10}  {verdict(job < BUDGET_S)}")
    line = f"10x the fleet at most {SCALING_BUDGET:g}x the time"
    print(f"  {line:<48}{f'{ratio:.2f}x':>10}  {verdict(ratio <= SCALING_BUDGET)}")
    print()
    print_profile(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
