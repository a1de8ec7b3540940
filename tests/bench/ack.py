"""Benchmark: slash command to ack over HTTP, the real gpubot against a bare Bolt app that only
acks, each server its own OS process as in production, driven by the same signed requests.

gpubot is started as the README documents it, `gpubot serve --http --port N` from this
virtualenv, with SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, SLACK_API_URL (a LocalSlack),
GPUBOT_DATABASE_URL (a temporary SQLite file) and GPUBOT_RULES_DIR (the shipped rules); its jobs
run inside it. The reference is `python -m tests.bench.bare_bolt --port N` (uvicorn and the same
SlackAsgi wrapper, one /gpu listener that only acks) with the same Slack variables. The
LocalSlack that answers the bot's response_url posts and deliveries, and the client threads,
stay in this process, as Slack is outside the bot's process in production.

Rounds alternate between the two servers; after each gpubot round the run waits for its
post-ack work (every command answered on its response_url in LocalSlack's record, no pending
outbox row in gpubot's SQLite file, read read-only), so it never lands in a bare Bolt round.
Both servers are stopped at the end, on errors too. Run with `python -m tests.bench.ack`.
Reports figures; never fails.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn
from urllib.parse import urlencode

import sqlalchemy as sa
from sqlmodel import col, func, select

from bot.server import EVENTS_PATH, free_port
from bot.settings import DEFAULT_RULES_DIR
from bot.slack.localapi import BOT_TOKEN, LocalSlack, payloads, sign
from bot.slack.localapi import server as local_server
from storage.tables import AuditRow, OutboxRow

CLIENTS = 20  # concurrent Slack deliveries in flight
ROUNDS = 10  # per server, alternating which server goes first
PER_ROUND = 60  # requests per round: 3 back-to-back per client thread
WARM_UP = 40  # per server, not measured
SETTLE_S = 20.0  # longest wait for the bot's post-ack work before the next round
START_S = 60.0  # longest wait for a server to answer /healthz
STOP_S = 15.0  # longest wait for a server to exit after SIGTERM, before SIGKILL
RATIO_BUDGET = 1.25  # our p99 / bare Bolt's p99
MAX_BUDGET_S = 1.0  # "nothing near Slack's 3 s": every ack well inside it
SLACK_DEADLINE_S = 3.0
SECRET = "bench-signing-secret"  # noqa: S105  (shared with the local workspace only)
BORROW = "borrow 1 l40s for 1h because bench"
RELEASE = "release all"
RELEASE_EVERY = 4  # each person's every 4th command gives back what they hold and withdraws asks
PEOPLE = ("U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001", "U0ERIN001")
# LocalSlack's HTTP server must take 20 response_url posts at once without dropping connections
# (socketserver's default backlog of 5 would make each dropped one retry after a 1 s SYN timeout).
LOCAL_SLACK_BACKLOG = 128
REPO = Path(__file__).resolve().parents[2]
GPUBOT = Path(sys.executable).parent / "gpubot"  # the console script of this virtualenv
# `gpubot serve` logs "time LEVEL logger: message"; uvicorn's own lines read "LEVEL:  message".
LOG_LINE = re.compile(
    r"^\S+ \S+ (?P<level>WARNING|ERROR|CRITICAL) (?P<name>\S+): (?P<msg>.*)$"
    r"|^(?P<ulevel>WARNING|ERROR|CRITICAL):\s+(?P<umsg>.*)$"
)


@dataclass
class Tally:
    """Ack times in seconds, and what did not come back as a 200."""

    times_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, elapsed_s: float, status: int) -> None:
        with self.lock:
            self.times_s.append(elapsed_s)
            self.statuses[status] += 1


@dataclass
class Child:
    """A server running as its own process, listening on 127.0.0.1:port, logging into `log`."""

    name: str
    argv: list[str]
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode} during the run; "
                f"its log ends:\n{self.log_tail()}"
            )


def server_env(local: LocalSlack, database: Path) -> dict[str, str]:
    """This environment without proxies or any Slack/gpubot setting of its own, plus the
    documented variables: the bot token, the signing secret, the LocalSlack API, the database
    and the shipped rules."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.lower().endswith("_proxy") and not name.startswith(("SLACK_", "GPUBOT_"))
    }
    return {
        **inherited,
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": local.api_url,
        "GPUBOT_DATABASE_URL": f"sqlite:///{database}",
        "GPUBOT_RULES_DIR": str(DEFAULT_RULES_DIR),
    }


def wait_healthy(child: Child) -> None:
    url = f"http://127.0.0.1:{child.port}/healthz"
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with {child.process.returncode} on start-up; "
                f"its log ends:\n{child.log_tail()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if json.loads(answer.read()).get("ok"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{child.name} did not answer {url} in {START_S:g} s:\n{child.log_tail()}")


def stop(child: Child) -> None:
    """SIGTERM (uvicorn shuts down cleanly on it), then SIGKILL if it is still there."""
    if child.alive():
        child.process.send_signal(signal.SIGTERM)
    try:
        child.process.wait(STOP_S)
    except subprocess.TimeoutExpired:
        child.process.kill()
        child.process.wait()


@contextlib.contextmanager
def spawned(
    name: str, argv: list[str], env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[Child]:
    """`argv` as its own process, output into `log`; yields once it answers /healthz, and is
    stopped when the block ends, however it ends."""
    with log.open("wb") as sink:
        process = subprocess.Popen(  # noqa: S603 - our own console script and module
            argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink
        )
        child = Child(name, argv, int(argv[argv.index("--port") + 1]), process, log)
        try:
            wait_healthy(child)
            yield child
        finally:
            stop(child)


class BotDatabase:
    """gpubot's SQLite file, opened read-only: the outbox backlog and the audit tags."""

    def __init__(self, path: Path) -> None:
        self.engine = sa.create_engine(
            f"sqlite:///file:{path}?mode=ro&uri=true", poolclass=sa.pool.NullPool
        )

    def pending(self) -> int:
        query = select(func.count()).select_from(OutboxRow).where(col(OutboxRow.state) == "pending")
        with self.engine.connect() as connection:
            return int(connection.execute(query).scalar_one())

    def audit_tags(self) -> Counter[str]:
        query = select(AuditRow.tag, func.count()).group_by(col(AuditRow.tag))
        with self.engine.connect() as connection:
            rows = connection.execute(query).all()
        return Counter({str(tag): int(n) for tag, n in rows})

    def close(self) -> None:
        self.engine.dispose()


def commands(count: int, start: int) -> list[tuple[str, str]]:
    """(user, text) in turn over PEOPLE; each person's every RELEASE_EVERY-th command releases."""
    out = []
    for k in range(start, start + count):
        user = PEOPLE[k % len(PEOPLE)]
        turn = k // len(PEOPLE)
        out.append((user, RELEASE if turn % RELEASE_EVERY == RELEASE_EVERY - 1 else BORROW))
    return out


class Sender:
    """Signs slash commands as Slack does and POSTs them on keep-alive connections per thread."""

    def __init__(self, local: LocalSlack) -> None:
        self.local = local
        self._conns = threading.local()

    def _connection(self, port: int) -> http.client.HTTPConnection:
        conns: dict[int, http.client.HTTPConnection] = self._conns.__dict__.setdefault("by", {})
        if port not in conns:
            conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        return conns[port]

    def request(self, user: str, text: str) -> tuple[bytes, dict[str, str]]:
        form = payloads.slash_command(
            user,
            text,
            response_url=payloads.fresh_response_url(self.local, "C0GPU", user),
            trigger_id=payloads.fresh_trigger_id(self.local, user),
            channel_name="gpu",
        )
        body = urlencode(form).encode()
        return body, sign(body, SECRET)

    def send(self, port: int, user: str, text: str, tally: Tally | None) -> None:
        body, headers = self.request(user, text)
        conn = self._connection(port)
        status, elapsed = 0, 0.0
        for attempt in (1, 2):
            start = time.perf_counter()
            try:
                conn.request("POST", EVENTS_PATH, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                status = response.status
            except ConnectionError:
                # uvicorn closes a keep-alive connection idle for 5 s (between rounds): reconnect
                # and send again, as an HTTP client does, timing the attempt that got through.
                conn.close()
                if attempt == 1:
                    continue
            except (OSError, http.client.HTTPException):
                conn.close()  # status 0: no answer
            elapsed = time.perf_counter() - start
            break
        if tally is not None:
            tally.add(elapsed, status)

    def close(self) -> None:
        for conn in self._conns.__dict__.get("by", {}).values():
            conn.close()


def run_round(
    pool: ThreadPoolExecutor,
    sender: Sender,
    port: int,
    batch: Sequence[tuple[str, str]],
    tally: Tally | None,
) -> None:
    """CLIENTS threads, each sending its share back to back; returns when all acks are in."""
    shares = [batch[i::CLIENTS] for i in range(CLIENTS)]

    def client(share: Sequence[tuple[str, str]]) -> None:
        for user, text in share:
            sender.send(port, user, text, tally)

    for future in [pool.submit(client, share) for share in shares]:
        future.result()


def settle(local: LocalSlack, database: BotDatabase, bot: Child, responses: int) -> float:
    """Wait until every command sent to the bot has answered on its response_url (LocalSlack's
    record) and no outbox row is pending (gpubot's SQLite file), so the bot's post-ack work never
    lands in a bare Bolt round. Seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < SETTLE_S:
        bot.check()
        if len(local.calls.of("response_url")) >= responses and database.pending() == 0:
            break
        time.sleep(0.02)
    return time.monotonic() - start


def nearest_rank(sorted_s: Sequence[float], q: float) -> float:
    return sorted_s[max(0, math.ceil(q * len(sorted_s)) - 1)]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


@dataclass
class Run:
    ours: Tally
    bare: Tally
    settle_s: float
    wall_s: float
    tags: Counter[str]
    responses: int
    violations: int


def measure(local: LocalSlack, database: BotDatabase, ours: Child, bare: Child) -> Run:
    sender = Sender(local)
    mine, reference = Tally(), Tally()
    settled, sent_to_bot = 0.0, 0
    start = time.monotonic()
    with ThreadPoolExecutor(CLIENTS, thread_name_prefix="slack-client") as pool:
        for child in (ours, bare):  # warm-up: auth.test, first connections, caches
            run_round(pool, sender, child.port, commands(WARM_UP, 0), None)
        sent_to_bot += WARM_UP
        settled += settle(local, database, ours, sent_to_bot)
        for r in range(ROUNDS):
            batch = commands(PER_ROUND, WARM_UP + r * PER_ROUND)
            order = [(ours, mine), (bare, reference)]
            for child, tally in order if r % 2 == 0 else order[::-1]:
                run_round(pool, sender, child.port, batch, tally)
                child.check()
                if child is ours:
                    sent_to_bot += len(batch)
                    settled += settle(local, database, ours, sent_to_bot)
        pool.submit(sender.close).result()
    wall = time.monotonic() - start
    return Run(
        mine,
        reference,
        settled,
        wall,
        database.audit_tags(),
        len(local.calls.of("response_url")),
        len(local.violations),
    )


def logged_warnings(log: Path) -> list[str]:
    """WARNING and above in a server's log, counted by level and logger, with an example."""
    kinds: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for line in log.read_text(errors="replace").splitlines():
        found = LOG_LINE.match(line)
        if found is None:
            continue
        if found["level"]:
            kind, message = (found["level"], found["name"]), found["msg"]
        else:
            kind, message = (found["ulevel"], "uvicorn"), found["umsg"]
        kinds[kind] += 1
        example.setdefault(kind, message)
    return [
        f"{n} x {level} {name}: {example[(level, name)][:100]}"
        for (level, name), n in kinds.most_common()
    ]


def row(name: str, tally: Tally) -> str:
    times = sorted(tally.times_s)
    p50, p99 = nearest_rank(times, 0.50), nearest_rank(times, 0.99)
    cells = f"{p50 * 1e3:>9.1f}{p99 * 1e3:>9.1f}{times[-1] * 1e3:>9.1f}"
    return f"  {name:<34}{len(times):>6}{cells}"


def report(run: Run, warnings: Mapping[str, list[str]]) -> None:
    total = ROUNDS * PER_ROUND
    releases = sum(text == RELEASE for _, text in commands(total, WARM_UP))
    print(
        f"Slash command to ack over HTTP, {CLIENTS} concurrent clients, {total} requests per server"
    )
    print()
    print(f"  {ROUNDS} rounds of {PER_ROUND} per server, alternating which goes first, after")
    print(f"  {WARM_UP} warm-up requests each. Each server is its own OS process, as in")
    print("  production: gpubot as `gpubot serve --http --port N` with the documented")
    print("  environment (its jobs running inside it), bare Bolt as")
    print("  `python -m tests.bench.bare_bolt --port N`; both serve with uvicorn + SlackAsgi.")
    print("  LocalSlack and the client threads run in this (the benchmark's) process.")
    print("  The clients send signed v0 form posts on keep-alive connections and time each to")
    print("  its HTTP response (the ack).")
    print(f"  mix: {total - releases} x `/gpu {BORROW}`,")
    print(f"       {releases} x `/gpu {RELEASE}` (each person's every {RELEASE_EVERY}th command),")
    print(f"       turn by turn over {len(PEOPLE)} members of the default rules' teams")
    print("  after each gpubot round the run waits for its post-ack work (response_url answers")
    print("  in LocalSlack, no pending outbox row in gpubot's SQLite file) to finish:")
    print(f"  {run.settle_s:.1f} s of {run.wall_s:.1f} s in all")
    print()
    print(f"  {'server':<34}{'acks':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    print(row("ours (gpubot serve --http)", run.ours))
    print(row("bare Bolt (ack only)", run.bare))
    ours, bare = sorted(run.ours.times_s), sorted(run.bare.times_s)
    ratio = nearest_rank(ours, 0.99) / nearest_rank(bare, 0.99)
    print(f"  ratio of p99s ours / bare Bolt: {ratio:.2f}x")
    for name, tally in (("ours", run.ours), ("bare Bolt", run.bare)):
        bad = {status: n for status, n in tally.statuses.items() if status != 200}
        if bad:
            print(f"  {name}: non-200 answers (0: none in time) {dict(sorted(bad.items()))}")
    print()
    print("  gpubot's decisions (audit tags, warm-up included):")
    for tag, n in sorted(run.tags.items()):
        print(f"    {tag:<24}{n:>6}")
    print(f"  response_url answers: {run.responses} of {WARM_UP + total} commands")
    if run.violations:
        print(f"  LocalSlack saw {run.violations} breaches of Slack's contract")
    for name, lines in warnings.items():
        if lines:
            print(f"  {name} logged warnings or errors:")
            for line in lines[:3]:
                print(f"    {line}")
    print()
    print(f"  {'budget':<52}{'figure':>10}  result")
    within = f"p99 within {RATIO_BUDGET:g}x of bare Bolt"
    print(f"  {within:<52}{f'{ratio:.2f}x':>10}  {verdict(ratio <= RATIO_BUDGET)}")
    near = f"no ack near Slack's {SLACK_DEADLINE_S:g} s (max < {MAX_BUDGET_S:g} s)"
    print(f"  {near:<52}{f'{ours[-1] * 1e3:.0f} ms':>10}  {verdict(ours[-1] < MAX_BUDGET_S)}")


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
    py = platform.python_version()
    print(
        f"gpubot benchmark: Python {py} on {platform.machine()}, {platform.system()}, "
        f"{os.cpu_count()} CPUs"
    )
    print()
    local_server._Server.request_queue_size = LOCAL_SLACK_BACKLOG
    with (
        tempfile.TemporaryDirectory(prefix="gpubot-bench-") as tmp,
        LocalSlack() as local,
    ):
        directory = Path(tmp)
        db_file = directory / "gpubot.db"
        env = server_env(local, db_file)
        ours_argv = [str(GPUBOT), "serve", "--http", "--port", str(free_port())]
        bare_argv = [sys.executable, "-m", "tests.bench.bare_bolt", "--port", str(free_port())]
        with (
            # cwd: a directory without a .env, so the environment alone configures gpubot
            spawned("gpubot", ours_argv, env, directory, directory / "gpubot.log") as ours,
            spawned("bare Bolt", bare_argv, env, REPO, directory / "bare.log") as bare,
        ):
            database = BotDatabase(db_file)
            try:
                run = measure(local, database, ours, bare)
            finally:
                database.close()
        warnings = {child.name: logged_warnings(child.log) for child in (ours, bare)}
    report(run, warnings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
