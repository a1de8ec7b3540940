"""Benchmark: slash command to ack and to answer over HTTP, gpubot against a bare Bolt app that
acks and then respond()s, each server its own OS process as in production, driven by the same
signed commands, open loop, at 5, 20 and 50 commands/s and then upward to the sustained rate.

gpubot is started as the README documents it, `gpubot serve --http --port N` from this
virtualenv, with SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, SLACK_API_URL (a LocalSlack in this
process), GPUBOT_DATABASE_URL (a temporary SQLite file), GPUBOT_RULES_DIR (the shipped rules) and
GPUBOT_TELEMETRY=simulated; its inbox workers, express delivery and jobs run inside it. The
reference is `python -m tests.bench.bare_bolt --port N`. The ack is the HTTP response; the
answer is the reply's POST to the command's response_url arriving at LocalSlack; both are timed
on this process's clock from the instant the command was due (tests.bench.load).

After each load the run waits until every command has its answer and gpubot has drained (its
/healthz shows no pending inbox or outbox row), so one load's backlog never lands in the next.
Both servers are stopped at the end, on errors too. Run with `python -m tests.bench.ack`.
Reports figures; never fails, unless a server cannot start.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

import sqlalchemy as sa
from sqlmodel import col, func, select

from bot.server import free_port
from storage.tables import AuditRow
from tests.bench.load import (
    SENDERS,
    SLACK_DEADLINE_S,
    Load,
    Sender,
    TimedSlack,
    nearest_rank,
    run_load,
)
from tests.bench.servers import Child, logged_warnings, server_env, spawned

LOADS = (5, 20, 50)  # commands/s, each shown side by side
LADDER = (75, 100, 125, 150, 200, 250, 300)  # further rungs while a server sustains all so far
BISECT = 2  # then this many halvings between a server's last good rate and its first miss
RUN_S = 15.0  # per load and rung
WARM_UP = 40  # commands per server at WARM_UP_RATE, not measured
WARM_UP_RATE = 20.0
DRAIN_S = 240.0  # longest wait for gpubot's backlog after a load
ANSWER_S = 30.0  # longest wait for bare Bolt's answers after a load
SUSTAINED_P99_S = 1.0  # what "sustained" asks of the answer p99
ACK_BUDGET = (50, 0.100)  # ack p99 below 100 ms at 50/s
ANSWER_BUDGET = (20, 0.300)  # answer p99 below 300 ms at 20/s
SUSTAINED_BUDGET = 100  # commands/s
SECRET = "bench-signing-secret"  # noqa: S105  (shared with the local workspace only)
BORROW = "borrow 1 l40s for 1h because bench"
RELEASE, MINE, STATUS = "release all", "mine", "status"
# Each person's commands in turn; every 4th gives back what they hold and withdraws their asks.
CYCLE = (
    *(BORROW, BORROW, BORROW, RELEASE),
    *(BORROW, MINE, BORROW, RELEASE),
    *(BORROW, STATUS, BORROW, RELEASE),
)
PEOPLE = ("U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001", "U0ERIN001")
REPO = Path(__file__).resolve().parents[2]
GPUBOT = Path(sys.executable).parent / "gpubot"  # the console script of this virtualenv


@dataclass
class Server:
    """One server under load: its process, its place in the command mix, its loads by rate."""

    child: Child
    label: str
    drains: bool  # has an inbox and outbox to wait for on /healthz
    turn: int = 0
    loads: dict[float, Load] = field(default_factory=dict)

    def next_command(self) -> tuple[str, str]:
        user = PEOPLE[self.turn % len(PEOPLE)]
        text = CYCLE[(self.turn // len(PEOPLE)) % len(CYCLE)]
        self.turn += 1
        return user, text

    def sustains(self, rate: float) -> bool:
        load = self.loads[rate]
        p99 = nearest_rank(load.answers_s(), 0.99)
        return load.non_200() == 0 and load.late() == 0 and p99 < SUSTAINED_P99_S

    def sustained(self) -> float | None:
        """The highest rate before the first that missed (in rising order); None: the first."""
        best = None
        for rate in sorted(self.loads):
            if not self.sustains(rate):
                break
            best = rate
        return best

    def still_sustains(self) -> bool:
        return self.sustained() == max(self.loads)


@dataclass
class Bench:
    local: TimedSlack
    sender: Sender
    pool: ThreadPoolExecutor

    def run(self, server: Server, rate: float, count: int, what: str = "") -> Load:
        shots = [self.sender.shot(*server.next_command()) for _ in range(count)]
        print(f"  {server.label} at {rate:g}/s{what} ...", file=sys.stderr, flush=True)
        # What earlier loads left (call log, workspace, shots) is kept out of this process's
        # collections, so a pause here never shows as a server's latency.
        gc.collect()
        gc.freeze()
        run_load(self.pool, self.sender, server.child.port, shots, rate)
        server.child.check()
        settle_s, settled = self.settle(server, [s.token for s in shots])
        arrivals = self.local.arrivals
        answered = {s.token: arrivals[s.token] for s in shots if s.token in arrivals}
        return Load(server.label, rate, shots, answered, settle_s, settled)

    def settle(self, server: Server, tokens: Sequence[str]) -> tuple[float, bool]:
        """Wait until every command has its answer and (gpubot) no inbox or outbox row is
        pending: seconds waited after the last ack, and whether that happened in time."""
        start = time.monotonic()
        limit = DRAIN_S if server.drains else ANSWER_S
        while time.monotonic() - start < limit:
            server.child.check()
            if all(t in self.local.arrivals for t in tokens):
                if not server.drains:
                    return time.monotonic() - start, True
                health = server.child.health()
                if health.get("inbox_pending") == 0 and health.get("outbox_pending") == 0:
                    return time.monotonic() - start, True
            time.sleep(0.1 if server.drains else 0.02)
        return time.monotonic() - start, False

    def measure(self, server: Server, rate: float) -> None:
        server.loads[rate] = self.run(server, rate, round(rate * RUN_S))

    def plan(self, ours: Server, bare: Server) -> None:
        for server in (ours, bare):
            self.run(server, WARM_UP_RATE, WARM_UP, " (warm-up)")
        for rate in LOADS:
            for server in (ours, bare):
                self.measure(server, rate)
        for rate in LADDER:
            going = [server for server in (ours, bare) if server.still_sustains()]
            if not going:
                break
            for server in going:
                self.measure(server, rate)
        for server in (ours, bare):
            self.bisect(server)

    def bisect(self, server: Server) -> None:
        """Narrow the sustained rate between the last good rate and the first miss."""
        for _ in range(BISECT):
            good = server.sustained() or 0
            misses = [rate for rate in sorted(server.loads) if rate > good]
            if not misses:
                return
            rate = 5 * round((good + misses[0]) / 10)  # a multiple of 5 halfway
            if rate <= good or rate >= misses[0]:
                return
            self.measure(server, rate)


def audit_tags(database: Path) -> Counter[str]:
    """gpubot's decisions by audit tag, from its SQLite file opened read-only."""
    engine = sa.create_engine(
        f"sqlite:///file:{database}?mode=ro&uri=true", poolclass=sa.pool.NullPool
    )
    try:
        query = select(AuditRow.tag, func.count()).group_by(col(AuditRow.tag))
        with engine.connect() as connection:
            rows = connection.execute(query).all()
    finally:
        engine.dispose()
    return Counter({str(tag): int(n) for tag, n in rows})


def ms(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.1f}"


def ratio(ours: float, bare: float) -> str:
    if not math.isfinite(ours) or not math.isfinite(bare) or bare <= 0:
        return "-"
    return f"{ours / bare:.1f}x"


def p(times: Sequence[float], q: float) -> float:
    return nearest_rank(times, q)


HEAD = (
    f"  {'server':<11}{'cmds':>6}{'ack p50':>9}{'p99':>8}{'max':>8}{'answer p50':>12}{'p99':>8}"
    f"{'max':>8}{'non-200':>9}{'late':>6}{'unanswered':>12}{'lag p99':>9}"
)


def row(load: Load) -> str:
    acks, answers, lags = load.acks_s(), load.answers_s(), load.lags_s()
    cells = [ms(p(acks, 0.5)), ms(p(acks, 0.99)), ms(acks[-1] if acks else math.nan)]
    widths = (9, 8, 8)
    text = "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
    cells = [ms(p(answers, 0.5)), ms(p(answers, 0.99)), ms(answers[-1])]
    text += "".join(f"{c:>{w}}" for c, w in zip(cells, (12, 8, 8), strict=True))
    counts = f"{load.non_200():>9}{load.late():>6}{load.unanswered():>12}"
    return f"  {load.server:<11}{len(load.shots):>6}{text}{counts}{ms(p(lags, 0.99)):>9}"


def settled(load: Load) -> str:
    if load.settled:
        return f"{load.settle_s:.1f} s"
    return f"not in {load.settle_s:.0f} s"


def report_loads(ours: Server, bare: Server) -> None:
    for rate in LOADS:
        mine, theirs = ours.loads[rate], bare.loads[rate]
        print(f"{rate} commands/s for {RUN_S:g} s ({len(mine.shots)} commands to each server)")
        print(HEAD)
        print(row(mine))
        print(row(theirs))
        acks = ratio(p(mine.acks_s(), 0.99), p(theirs.acks_s(), 0.99))
        answers = ratio(p(mine.answers_s(), 0.99), p(theirs.answers_s(), 0.99))
        print(f"  gpubot / bare Bolt, p99: ack {acks}, answer {answers}")
        print(
            f"  after the last ack: gpubot answered all and drained in {settled(mine)}, "
            f"bare Bolt answered all in {settled(theirs)}"
        )
        print()


def report_sustained(ours: Server, bare: Server) -> None:
    print(
        f"Sustained rate: answer p99 < {SUSTAINED_P99_S:g} s, every ack a 200 inside Slack's "
        f"{SLACK_DEADLINE_S:g} s, every command answered; {RUN_S:g} s per rate, rising until one "
        f"misses, then {BISECT} halvings"
    )
    print(
        f"  {'rate/s':>7}  {'server':<11}{'ack p99':>9}{'answer p99':>12}{'non-200':>9}"
        f"{'late':>6}{'unanswered':>12}{'lag p99':>9}  {'drained':<16}result"
    )
    for rate in sorted(set(ours.loads) | set(bare.loads)):
        for server in (ours, bare):
            load = server.loads.get(rate)
            if load is None:
                continue
            acks, answers = load.acks_s(), load.answers_s()
            print(
                f"  {rate:>7g}  {server.label:<11}{ms(p(acks, 0.99)):>9}"
                f"{ms(p(answers, 0.99)):>12}{load.non_200():>9}{load.late():>6}"
                f"{load.unanswered():>12}{ms(p(load.lags_s(), 0.99)):>9}  "
                f"{settled(load):<16}{'ok' if server.sustains(rate) else 'MISS'}"
            )
    for server in (ours, bare):
        print(f"  sustained, {server.label}: {sustained_text(server)}")
    print()


def sustained_text(server: Server) -> str:
    best = server.sustained()
    if best is None:
        return f"below {min(server.loads):g} commands/s"
    if best == max(server.loads):
        return f"at least {best:g} commands/s (the top rate tried)"
    return f"{best:g} commands/s"


def report_budgets(ours: Server) -> None:
    rate, limit = ACK_BUDGET
    ack = p(ours.loads[rate].acks_s(), 0.99)
    rate2, limit2 = ANSWER_BUDGET
    answer = p(ours.loads[rate2].answers_s(), 0.99)
    best = ours.sustained()
    lines = [
        (f"ack p99 < {limit * 1e3:g} ms at {rate}/s", f"{ms(ack)} ms", ack < limit),
        (f"answer p99 < {limit2 * 1e3:g} ms at {rate2}/s", f"{ms(answer)} ms", answer < limit2),
        (
            f">= {SUSTAINED_BUDGET} commands/s sustained with answer p99 < {SUSTAINED_P99_S:g} s",
            "-" if best is None else f"{best:g}/s",
            best is not None and best >= SUSTAINED_BUDGET,
        ),
    ]
    print(f"  {'budget (gpubot)':<62}{'figure':>12}  result")
    for name, figure, ok in lines:
        print(f"  {name:<62}{figure:>12}  {'PASS' if ok else 'MISS'}")


def report(
    ours: Server,
    bare: Server,
    local: TimedSlack,
    tags: Counter[str],
    warnings: dict[str, list[str]],
) -> None:
    mix = Counter(CYCLE)
    print("Slash command to ack and to answer over HTTP, gpubot against bare Bolt, open loop")
    print()
    print("  Each server is its own OS process: gpubot as `gpubot serve --http --port N` (SQLite")
    print("  file, shipped rules, simulated telemetry, GPUBOT_WORKERS unset: its default), bare")
    print("  Bolt as `python -m tests.bench.bare_bolt --port N` (ack(), then respond() a line).")
    print("  LocalSlack (Web API and response_urls) and the senders run in this process.")
    print(f"  Open loop: each command is handed to one of {SENDERS} sender threads at its due")
    print("  time, whatever the server does. ack = due -> HTTP response; answer = due -> its")
    print("  response_url POST arriving at LocalSlack; lag = due -> actually sent (the bench")
    print("  falling behind). late: acks after Slack's 3 s. Times in ms.")
    shares = ", ".join(f"{n}/{len(CYCLE)} `{text}`" for text, n in mix.most_common())
    print(f"  Mix, each person's commands in turn over {len(PEOPLE)} people: {shares}.")
    print(f"  Warm-up: {WARM_UP} commands per server at {WARM_UP_RATE:g}/s, not counted.")
    print()
    report_loads(ours, bare)
    report_sustained(ours, bare)
    print("  gpubot's decisions (audit tags, warm-up included):")
    for tag, n in sorted(tags.items()):
        print(f"    {tag:<24}{n:>7}")
    refused = Counter(c.status for c in local.calls.of("response_url") if c.status != 200)
    if refused:
        print(
            f"  response_url posts LocalSlack refused, by status: {dict(sorted(refused.items()))}"
        )
    if local.violations:
        print(f"  LocalSlack saw {len(local.violations)} breaches of Slack's contract, e.g.:")
        print(f"    {local.violations[0][:200]}")
    for name, lines in warnings.items():
        if lines:
            print(f"  {name} logged warnings or errors:")
            for line in lines[:3]:
                print(f"    {line}")
    print()
    report_budgets(ours)


def _exit_on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through `spawned`, which stops both servers


def main() -> int:
    # slack_sdk would send even loopback calls to an environment proxy (it ignores NO_PROXY).
    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        os.environ.pop(name)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    if not GPUBOT.exists():
        print(f"error: no gpubot console script at {GPUBOT}; pip install -e . first")
        return 2
    cpu = platform.processor() or platform.machine()
    print(
        f"gpubot benchmark: Python {platform.python_version()} on {cpu}, {platform.system()}, "
        f"{os.cpu_count()} CPUs, shared by the bench, both servers and LocalSlack"
    )
    print()
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-") as tmp, TimedSlack() as local:
        directory = Path(tmp)
        db_file = directory / "gpubot.db"
        env = server_env(local, db_file, SECRET, {"GPUBOT_TELEMETRY": "simulated"})
        ours_argv = [str(GPUBOT), "serve", "--http", "--port", str(free_port())]
        bare_argv = [sys.executable, "-m", "tests.bench.bare_bolt", "--port", str(free_port())]
        sender = Sender(local, SECRET)
        try:
            with (
                # cwd: a directory without a .env, so the environment alone configures gpubot
                spawned("gpubot", ours_argv, env, directory, directory / "gpubot.log") as us,
                spawned("bare Bolt", bare_argv, env, REPO, directory / "bare.log") as them,
                ThreadPoolExecutor(SENDERS, thread_name_prefix="slack-client") as pool,
            ):
                ours, bare = Server(us, "gpubot", drains=True), Server(them, "bare Bolt", False)
                Bench(local, sender, pool).plan(ours, bare)
                tags = audit_tags(db_file)
        finally:
            sender.close()
        warnings = {child.name: logged_warnings(child.log) for child in (us, them)}
        report(ours, bare, local, tags, warnings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
