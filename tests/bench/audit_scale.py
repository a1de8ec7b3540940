"""Benchmark: `gpubot audit verify` and `gpubot audit export --format jsonl` over 1,000,000 audit
rows, on a SQLite file and on PostgreSQL, with the budget lines (each under 10 s, streamed:
memory flat whatever the size of the log).

The log is made fast: chained rows computed here (bodies of about 850 bytes, like a year of a
busy lab's decisions) and bulk inserted, not appended one by one. Each command then runs in a
fresh Python process, as the CLI runs it, which reports its time, the CPU time it and its
worker processes used (on a busy machine wall time stretches; CPU time much less), and its peak
memory. One run; figures only, it never fails.
Run with `python -m tests.bench.audit_scale [--rows N]`; `--sqlite FILE` and `--postgres-url URL`
keep the logs between runs (filled once, then reused as they are), `--only` measures one database.

`measure(database_url, rows)` is the same measurement for another benchmark to call.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import psycopg

from storage import audit, migrate
from storage.audit_text import body_parts, canonical_json, digest
from storage.db import normalise_url
from tests.support import postgres

ROWS = 1_000_000
BUDGET_S = 10.0
START = datetime(2025, 12, 1, tzinfo=UTC)
_COLUMNS = (
    "id, at, actor, tag, subject, outcome, deciding_rule, matching_rules, facts, detail, "
    "revision, engine, prev_hash, hash"
)
_TAGS = (
    ("lease:granted", "approve", "within-nominal"),
    ("borrow:approved", "approve", "manager-approved"),
    ("lease:warned", "warn", "idle-2h"),
    ("lease:reclaimed", "reclaim", "idle-4h"),
    ("lease:released", "release", ""),
    ("borrow:queued", "queue", "over-nominal"),
    ("sweep:notified", "notify", "expiry-24h"),
    ("extend:approved", "approve", "extend-within-week"),
)
_PEOPLE = [f"U0{name:A<7}"[:9].upper() for name in ("alice", "bob", "carol", "dave", "erin")]
_NOTES = ("ablation runs", "évaluation du modèle ✓", "fine-tune, 3 seeds", 'quote "this"')


def _facts(rng: random.Random, n: int) -> dict[str, Any]:
    """A decision's facts as the rules saw them: about twenty keys."""
    return {
        "request.gpus": rng.choice((1, 2, 4, 8)),
        "request.hours": rng.choice((2, 6, 12, 24, 48)),
        "request.pool": rng.choice(("a100", "h100", "l40s")),
        "request.reason": rng.choice(_NOTES),
        "request.priority": rng.choice(("normal", "high", "low")),
        "team.name": rng.choice(("vision", "nlp", "platform", "speech")),
        "team.nominal": 8,
        "team.used": rng.randint(0, 12),
        "team.used_after": rng.randint(0, 12) + 0.5,
        "team.borrowing_limit": 4,
        "team.lending_limit": 2,
        "pool.free": rng.randint(0, 64),
        "pool.total": 64,
        "pool.queue_length": rng.randint(0, 20),
        "user.active_leases": rng.randint(0, 4),
        "user.gpu_hours_30d": round(rng.uniform(0, 900), 1),
        "lease.idle_minutes": rng.randint(0, 600),
        "lease.util_pct": round(rng.uniform(0, 100), 1),
        "automation.paused": False,
        "now.weekday": n % 7,
    }


def _detail(rng: random.Random, at: datetime) -> dict[str, Any]:
    node = f"a100-node-{rng.randint(1, 1250):04d}"
    return {
        "holder": rng.choice(_PEOPLE),
        "gpus": [f"{node}:{i}" for i in range(rng.choice((1, 2, 4)))],
        "expires_at": (at + timedelta(hours=6)).isoformat(),
        "because": rng.choice(_NOTES),
    }


def chained_rows(count: int, seed: int = 16) -> Iterator[tuple[Any, ...]]:
    """`count` chained audit rows, column values in `_COLUMNS` order (times as stored text).

    A few hundred distinct facts and details are made and reused: the bodies differ by id,
    time and hash anyway, and making a million dictionaries would take longer than the test.
    """
    rng = random.Random(seed)
    facts = [canonical_json(_facts(rng, n)) for n in range(256)]
    details = [canonical_json(_detail(rng, START + timedelta(hours=n))) for n in range(256)]
    encode = encode_basestring
    prev = audit.GENESIS_HASH
    for n in range(1, count + 1):
        at = START + timedelta(seconds=n * 31, microseconds=(n * 7919) % 1_000_000)
        tag, outcome, rule = _TAGS[n % len(_TAGS)]
        actor, subject = _PEOPLE[n % len(_PEOPLE)], f"lease:{n // 3}"
        rules = f'["{rule}"]' if rule else "[]"
        fact, detail = facts[n % 256], details[(n * 7) % 256]
        text = (actor, tag, subject, outcome, rule, "c7aeb8f53f710903", "durable", prev)
        iso = at.isoformat()
        head, tail = body_parts(
            (
                str(n),
                f'"{iso}"',
                *map(encode, text[:5]),
                rules,
                fact,
                detail,
                *map(encode, text[5:]),
            )
        )
        row_hash = digest(prev, head + tail)
        stored = f"{iso[:10]} {iso[11:19]}.{at.microsecond:06d}"
        yield (n, stored, *text[:5], rules, fact, detail, *text[5:], row_hash)
        prev = row_hash


def fill(database_url: str, rows: int) -> float:
    """Migrate the empty database at `database_url` and bulk insert `rows` chained rows and
    their head; the seconds it took."""
    started = time.perf_counter()
    migrate.upgrade(database_url)
    insert_chain(database_url, rows)
    return time.perf_counter() - started


def insert_chain(database_url: str, rows: int) -> None:
    """Bulk insert `rows` chained rows and their head into the empty audit table."""
    url = normalise_url(database_url)
    last_id, last_hash = 0, audit.GENESIS_HASH
    if url.get_backend_name() == "sqlite":
        with closing(sqlite3.connect(url.database or "")) as connection, connection:
            marks = ", ".join("?" * 14)
            for batch in _batches(chained_rows(rows), 50_000):
                connection.executemany(f"INSERT INTO audit ({_COLUMNS}) VALUES ({marks})", batch)  # noqa: S608
                last_id, last_hash = batch[-1][0], batch[-1][-1]
            connection.execute(
                "INSERT INTO audit_head (id, last_id, last_hash) VALUES (1, ?, ?)",
                (last_id, last_hash),
            )
        return
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as server:
        with server.cursor().copy(f"COPY audit ({_COLUMNS}) FROM STDIN") as copy:
            for row in chained_rows(rows):
                copy.write_row((*row[:1], row[1] + "+00", *row[2:]))
                last_id, last_hash = row[0], row[-1]
        server.execute(
            "INSERT INTO audit_head (id, last_id, last_hash) VALUES (1, %s, %s)",
            (last_id, last_hash),
        )
        # The state of a log written over months: hint bits set, statistics known.
        server.execute("VACUUM ANALYZE audit")


def _batches(rows: Iterator[tuple[Any, ...]], size: int) -> Iterator[list[tuple[Any, ...]]]:
    batch: list[tuple[Any, ...]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _command(args: list[str]) -> dict[str, float]:
    """Run `gpubot <args>` in a fresh process (the CLI in-process there): its seconds, the CPU
    seconds it and its workers used, and its peak memory."""
    code = (
        "import json, resource, sys, time\n"
        "from bot.cli.app import app\n"
        "started = time.perf_counter()\n"
        "try:\n"
        f"    app({args!r}, standalone_mode=False)\n"
        "finally:\n"
        "    seconds = time.perf_counter() - started\n"
        "    own = resource.getrusage(resource.RUSAGE_SELF)\n"
        "    workers = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "    cpu = sum(u.ru_utime + u.ru_stime for u in (own, workers))\n"
        # The peak of this process since it started (ru_maxrss would count what its parent
        # held when it was forked; a worker's would count this process).
        "    status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
        "    figures = [seconds, int(status.split()[0]), cpu]\n"
        "    sys.stderr.write(json.dumps(figures) + '\\n')\n"
    )
    done = subprocess.run(  # noqa: S603  (our own interpreter and code)
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"gpubot {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    seconds, own_kib, cpu_s = json.loads(done.stderr.strip().splitlines()[-1])
    return {"seconds": seconds, "cpu_s": cpu_s, "rss_mb": own_kib / 1024}


def held(database_url: str) -> int:
    """The rows of the audit log at `database_url` by its head; 0 when it has none yet."""
    url = normalise_url(database_url)
    query = "SELECT last_id FROM audit_head WHERE id = 1"
    try:
        if url.get_backend_name() == "sqlite":
            with closing(sqlite3.connect(url.database or "")) as connection:
                found = connection.execute(query).fetchone()
        else:
            conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
            with psycopg.connect(conninfo) as server:
                found = server.execute(query).fetchone()
    except (sqlite3.Error, psycopg.Error):
        return 0  # not migrated yet
    return int(found[0]) if found else 0


def measure(database_url: str, rows: int = ROWS, *, reuse: bool = False) -> dict[str, float]:
    """Fill the empty database at `database_url` with `rows` chained audit rows, then time
    `gpubot audit verify` and `gpubot audit export --format jsonl` on it. With `reuse`, a
    database whose log holds `rows` rows already is measured as it is (fill_s is then 0)."""
    existing = held(database_url) if reuse else 0
    if existing not in (0, rows):
        raise RuntimeError(f"{database_url} holds {existing:,} audit rows, not {rows:,}")
    fill_s = fill(database_url, rows) if existing == 0 else 0.0
    verify = _command(["audit", "verify", "--database-url", database_url])
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-audit-") as folder:
        output = str(Path(folder) / "audit.jsonl")
        export = _command(
            ["audit", "export", "--format", "jsonl", "-o", output, "--database-url", database_url]
        )
        export_mb = os.path.getsize(output) / 1e6
    return {
        "rows": float(rows),
        "fill_s": fill_s,
        "verify_s": verify["seconds"],
        "export_s": export["seconds"],
        "verify_cpu_s": verify["cpu_s"],
        "export_cpu_s": export["cpu_s"],
        "verify_rss_mb": verify["rss_mb"],
        "export_rss_mb": export["rss_mb"],
        "export_mb": export_mb,
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _report(kind: str, figures: dict[str, float]) -> None:
    rows = int(figures["rows"])
    if figures["fill_s"]:
        print(f"  {kind}: {rows:,} rows made and inserted in {figures['fill_s']:.1f} s")
    else:
        print(f"  {kind}: {rows:,} rows, the log kept from an earlier run")
    for name in ("verify", "export"):
        seconds = figures[f"{name}_s"]
        print(
            f"    gpubot audit {name:<7}{seconds:>8.2f} s  {rows / seconds:>10,.0f} rows/s  "
            f"CPU {figures[f'{name}_cpu_s']:.1f} s, workers included  "
            f"peak RSS {figures[f'{name}_rss_mb']:.0f} MB"
        )
    print(f"    ({figures['export_mb']:.0f} MB of JSON lines written)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.audit_scale")
    parser.add_argument("--rows", type=int, default=ROWS, help="audit rows in each database")
    parser.add_argument(
        "--sqlite", metavar="FILE", help="SQLite file to keep: filled if new, else reused"
    )
    parser.add_argument(
        "--postgres-url",
        help="PostgreSQL database to use instead of a throwaway server: filled if empty, "
        "else reused",
    )
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="measure one database")
    args = parser.parse_args(argv)
    print(
        f"gpubot audit benchmark: Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start"
    )
    print()
    results: dict[str, dict[str, float]] = {}
    if args.only != "postgresql":
        if args.sqlite:
            url = f"sqlite:///{Path(args.sqlite).resolve()}"
            results["SQLite file"] = measure(url, args.rows, reuse=True)
        else:
            with tempfile.TemporaryDirectory(prefix="gpubot-bench-audit-") as folder:
                url = f"sqlite:///{Path(folder) / 'gpubot.db'}"
                results["SQLite file"] = measure(url, args.rows)
        _report("SQLite file", results["SQLite file"])
    if args.only != "sqlite":
        if args.postgres_url:
            results["PostgreSQL"] = measure(args.postgres_url, args.rows, reuse=True)
        else:
            with postgres.server() as server:
                name = server.create_database()
                try:
                    results["PostgreSQL"] = measure(server.url_for(name), args.rows)
                finally:
                    server.drop_database(name)
        _report("PostgreSQL", results["PostgreSQL"])
    print(
        f"  load average {os.getloadavg()[0]:.1f} at the end (a busy machine stretches wall time)"
    )
    print()
    print(f"  {'budget':<52}{'figure':>10}{'ratio':>8}  result")
    for kind, figures in results.items():
        for name in ("verify", "export"):
            seconds = figures[f"{name}_s"]
            line = f"{name} {int(figures['rows']):,} rows on {kind}, under {BUDGET_S:g} s"
            print(
                f"  {line:<52}{f'{seconds:.2f} s':>10}{seconds / BUDGET_S:>8.2f}  "
                f"{verdict(seconds < BUDGET_S)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
