"""Benchmark: borrow decisions through the durable wrapper against the pure-Python reference, and
hash-chained audit appends on SQLite against a plain insert. Reports figures; never fails.

Run with `python -m tests.bench.rules` (or `make bench`).
"""

from __future__ import annotations

import itertools
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from rules.domain import Subject
from rules.engine import RuleEngine, decide
from rules.engine.live import build_engine
from rules.policy import Policy
from storage import audit, migrate
from storage.db import Database
from storage.tables import AuditRow
from tests.builders import default_policy

DECISIONS = 30_000
WARM_UP = 3_000
RUNS = 3
AUDIT_ROWS = 3_000
DECISIONS_BUDGET = 20_000  # decisions/s through the durable wrapper
RATIO_BUDGET = 3.0  # durable time / reference time
AUDIT_BUDGET = 2_000  # rows/s on SQLite


def request_facts(policy: Policy, count: int, seed: int = 7) -> list[dict[str, Any]]:
    """The shipped request cases plus variations: sizes, lengths, priorities, load, quota use."""
    bases = [dict(c.facts) for c in policy.cases if c.subject == Subject.REQUEST]
    rng = random.Random(seed)
    facts = list(bases)
    while len(facts) < count:
        f = dict(rng.choice(bases))
        gpus = rng.choice([1, 1, 2, 2, 2, 4, 4, 8, 9])
        used = rng.randint(0, int(f["team.limit"]))
        borrow = f["request.kind"] == "borrow"
        priority, rank = rng.choice([("low", 0), ("normal", 1), ("normal", 1), ("high", 2)])
        f["request.gpus"] = gpus
        f["request.duration"] = rng.choice([60.0, 240.0, 360.0, 720.0, 1440.0, 2880.0, 5760.0])
        f["request.priority"], f["request.priority_rank"] = priority, rank
        f["request.has_reason"] = rng.random() < 0.8
        f["team.used"] = used
        f["team.used_after"] = used + gpus if borrow else used
        f["team.borrowed_after"] = max(0, f["team.used_after"] - f["team.nominal"])
        f["pool.free"] = rng.randint(0, int(f["pool.size"]))
        f["pool.queued"] = rng.choice([0, 0, 0, 1, 3])
        facts.append(f)
    return facts


def best_rate(run: Callable[[], None], count: int) -> float:
    """Operations per second of the fastest of RUNS runs."""
    best = float("inf")
    for _ in range(RUNS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return count / best


def decide_all(policy: Policy, engine: RuleEngine, facts: list[dict[str, Any]], n: int) -> None:
    for i in range(n):
        decide(policy, engine, Subject.REQUEST, facts[i % len(facts)])


def disagreements(policy: Policy, a: RuleEngine, b: RuleEngine, facts: list[dict[str, Any]]) -> int:
    def key(engine: RuleEngine, f: Mapping[str, Any]) -> tuple[str, str]:
        d = decide(policy, engine, Subject.REQUEST, f)
        return str(d.verdict), d.deciding

    return sum(key(a, f) != key(b, f) for f in facts)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def bench_decisions(policy: Policy) -> None:
    facts = request_facts(policy, 500)
    durable = build_engine(policy, "durable")
    reference = build_engine(policy, "reference")
    try:
        for engine in (durable, reference):
            decide_all(policy, engine, facts, WARM_UP)
        rates: dict[str, float] = {}
        for engine in (durable, reference):
            run = partial(decide_all, policy, engine, facts, DECISIONS)
            rates[engine.name] = best_rate(run, DECISIONS)
        differ = disagreements(policy, durable, reference, facts)
    finally:
        durable.close()
        reference.close()
    ours = rates[durable.name]
    ref = rates[reference.name]
    ratio = ref / ours  # time per decision: durable / reference
    print(f"Request decisions through rules.engine.decide ({len(facts)} distinct borrow and extend")
    print(f"facts, {DECISIONS:,} decisions per run after {WARM_UP:,} warm-up, best of {RUNS})")
    print()
    print(f"  {'engine':<22}{'decisions/s':>14}{'µs/decision':>14}")
    print(f"  {f'ours ({durable.name})':<22}{ours:>14,.0f}{1e6 / ours:>14.1f}")
    print(f"  {'reference':<22}{ref:>14,.0f}{1e6 / ref:>14.1f}")
    print(f"  ratio durable time / reference time: {ratio:.2f}x")
    print(f"  engines disagree on {differ} of {len(facts)} facts")
    if durable.name != "durable":
        print("  note: durable could not be imported; 'ours' is the reference fallback")
    print()
    print(f"  {'budget':<44}{'figure':>14}  result")
    budget = f">= {DECISIONS_BUDGET:,} decisions/s (durable)"
    print(f"  {budget:<44}{f'{ours:,.0f}/s':>14}  {verdict(ours >= DECISIONS_BUDGET)}")
    within = f"durable within {RATIO_BUDGET:g}x of the reference"
    print(f"  {within:<44}{f'{ratio:.2f}x':>14}  {verdict(ratio <= RATIO_BUDGET)}")


def an_entry(facts: Mapping[str, Any]) -> audit.AuditEntry:
    return audit.AuditEntry(
        actor="U0ALICE01",
        tag="borrow:approved",
        subject="request:1",
        outcome="approve",
        deciding_rule="within-nominal",
        matching_rules=("within-nominal",),
        facts=facts,
        detail={"gpus": ["a100-node-01:0", "a100-node-01:1"]},
        revision="c7aeb8f53f710903",
        engine="durable",
    )


def append_rate(database: Database, entry: audit.AuditEntry, rows: int) -> float:
    """Rows/s with the hash chain: one write transaction per row."""
    at = datetime.now(UTC)
    start = time.perf_counter()
    for _ in range(rows):
        with database.write() as session:
            audit.append(session, entry, at=at)
    return rows / (time.perf_counter() - start)


_PLAIN_IDS = itertools.count()  # `hash` is unique: give every plain row its own


def insert_rate(database: Database, entry: audit.AuditEntry, rows: int) -> float:
    """Rows/s for the same rows inserted without the chain: no head lock, no hashing."""
    table = AuditRow.__table__  # type: ignore[attr-defined]
    values = {
        "at": datetime.now(UTC),
        "actor": entry.actor,
        "tag": entry.tag,
        "subject": entry.subject,
        "outcome": entry.outcome,
        "deciding_rule": entry.deciding_rule,
        "matching_rules": list(entry.matching_rules),
        "facts": dict(entry.facts),
        "detail": dict(entry.detail),
        "revision": entry.revision,
        "engine": entry.engine,
        "prev_hash": "",
    }
    insert = sa.insert(table)
    start = time.perf_counter()
    for _ in range(rows):
        with database.write() as session:
            session.execute(insert, {**values, "hash": f"plain-{next(_PLAIN_IDS)}"})
    return rows / (time.perf_counter() - start)


def bench_audit(policy: Policy) -> None:
    entry = an_entry(request_facts(policy, 1)[0])
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-") as tmp:
        chained_url = f"sqlite:///{Path(tmp) / 'chained.db'}"
        plain_url = f"sqlite:///{Path(tmp) / 'plain.db'}"
        for url in (chained_url, plain_url):
            migrate.upgrade(url)
        chained, plain = Database(chained_url), Database(plain_url)
        try:
            append_rate(chained, entry, 100)  # warm-up: creates the head, fills caches
            insert_rate(plain, entry, 100)
            ours = append_rate(chained, entry, AUDIT_ROWS)
            bare = insert_rate(plain, entry, AUDIT_ROWS)
            with chained.read() as session:
                report = audit.verify(session)
        finally:
            chained.dispose()
            plain.dispose()
    print(
        f"Audit appends on a SQLite file (WAL), one write transaction per row, {AUDIT_ROWS:,} rows"
    )
    print()
    print(f"  {'path':<40}{'rows/s':>10}")
    print(f"  {'ours (hash-chained audit.append)':<40}{ours:>10,.0f}")
    print(f"  {'reference (plain insert, no chain)':<40}{bare:>10,.0f}")
    print(f"  ratio chained time / plain time: {bare / ours:.2f}x")
    chain = "intact" if report.ok else f"BROKEN ({report.problem})"
    print(f"  chain after the run: {report.checked:,} rows verified, {chain}")
    print()
    print(f"  {'budget':<44}{'figure':>14}  result")
    budget = f">= {AUDIT_BUDGET:,} rows/s on SQLite"
    print(f"  {budget:<44}{f'{ours:,.0f}/s':>14}  {verdict(ours >= AUDIT_BUDGET)}")


def main() -> int:
    py = platform.python_version()
    print(f"gpubot benchmark: Python {py} on {platform.machine()}, {platform.system()}")
    print()
    policy = default_policy()
    bench_decisions(policy)
    print()
    bench_audit(policy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
