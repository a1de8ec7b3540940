"""The memory of a real `gpubot serve --http` under command load, for the scale benchmark:
its RSS once started, at the peak of a burst of signed slash commands from 200 senders
(tests.bench.load), and after the burst has been answered and the process left alone.

The server runs the code of `repo` (this checkout by default), on the database and rules it is
given, with simulated telemetry. Run alone with `python -m tests.bench.scale_rss [--repo PATH]
[--gpus N]`, or from tests.bench.scale.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bot.server import free_port
from bot.settings import DEFAULT_RULES_DIR
from tests.bench.load import Sender, TimedSlack, run_load
from tests.bench.servers import Child, server_env, spawned

REPO = Path(__file__).resolve().parents[2]
GPUBOT = Path(sys.executable).parent / "gpubot"
SECRET = "bench-signing-secret"  # noqa: S105  (shared with the local workspace only)
CLIENTS = 200  # senders, each with its own connection
RATE = 100.0  # commands per second in the burst
BURST = 1000  # commands
QUIET_S = 25.0  # left alone after the burst (the heap is looked at every 10 s)
ANSWER_S = 90.0  # longest wait for the burst's answers
PEOPLE = ("U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001", "U0ERIN001")
COMMANDS = ("status", "borrow 1 l40s for 1h because bench", "mine", "release all", "why L1")


@dataclass
class Rss:
    started_mb: float
    peak_mb: float
    after_mb: float
    answered: int
    sent: int
    acks: dict[int, int]  # HTTP status -> commands (0: no answer within the sender's timeout)

    def acked(self) -> str:
        """How the acks went, e.g. "HTTP 200: 1000"."""
        return ", ".join(
            f"{f'HTTP {status}' if status else 'no answer'}: {n}"
            for status, n in sorted(self.acks.items())
        )


def rss_mb(pid: int) -> float:
    """VmRSS of a process, from /proc (0 where there is none)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Watch:
    """The highest RSS of a process, sampled every 50 ms while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mb(self.pid))


def measure(
    database: Path, rules: Path = DEFAULT_RULES_DIR, *, repo: Path = REPO, burst: int = BURST
) -> Rss:
    """Serve `database` (a SQLite file, made when missing) with `rules`, the code of `repo`;
    RSS before, at the peak of, and after a burst of commands."""
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-rss-") as tmp, TimedSlack() as local:
        directory = Path(tmp)
        env = server_env(
            local,
            database,
            SECRET,
            {
                "GPUBOT_TELEMETRY": "simulated",
                "GPUBOT_RULES_DIR": str(rules),
                "PYTHONPATH": str(repo),
            },
        )
        argv = [str(GPUBOT), "serve", "--http", "--port", str(free_port())]
        sender = Sender(local, SECRET)
        try:
            with (
                spawned("gpubot", argv, env, directory, directory / "gpubot.log") as child,
                ThreadPoolExecutor(CLIENTS, thread_name_prefix="slack-client") as pool,
            ):
                return _burst(child, local, sender, pool, burst)
        finally:
            sender.close()


def _burst(
    child: Child, local: TimedSlack, sender: Sender, pool: ThreadPoolExecutor, burst: int
) -> Rss:
    time.sleep(2.0)  # start-up's own allocations settle
    started = rss_mb(child.pid)
    shots = [
        sender.shot(PEOPLE[k % len(PEOPLE)], COMMANDS[(k // len(PEOPLE)) % len(COMMANDS)])
        for k in range(burst)
    ]
    with Watch(child.pid) as watch:
        run_load(pool, sender, child.port, shots, RATE)
        deadline = time.monotonic() + ANSWER_S
        tokens = {s.token for s in shots}
        while time.monotonic() < deadline and not tokens <= local.arrivals.keys():
            child.check()
            time.sleep(0.2)
    answered = len(tokens & local.arrivals.keys())
    time.sleep(QUIET_S)
    acks = dict(Counter(s.status for s in shots))
    return Rss(started, watch.peak, rss_mb(child.pid), answered, len(shots), acks)


def main(argv: list[str] | None = None) -> int:
    from tests.bench import scale  # the fleet builder, only when run alone

    parser = argparse.ArgumentParser(prog="python -m tests.bench.scale_rss")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose code serves")
    parser.add_argument(
        "--gpus", type=int, default=0, help="a fleet of this many (0: the shipped rules' own)"
    )
    parser.add_argument("--burst", type=int, default=BURST)
    args = parser.parse_args(argv)
    if args.gpus:
        with scale.fleet("sqlite", args.gpus, None) as f:
            got = measure(f.tmp / "gpubot.db", f.rules, repo=args.repo, burst=args.burst)
    else:
        with tempfile.TemporaryDirectory(prefix="gpubot-bench-rss-") as tmp:
            got = measure(Path(tmp) / "gpubot.db", repo=args.repo, burst=args.burst)
    print(
        f"gpubot serve ({args.repo}), {args.gpus or 'the shipped rules'} GPUs, "
        f"{got.sent} commands from {CLIENTS} "
        f"senders at {RATE:g}/s (acks: {got.acked()}; {got.answered} answered): "
        f"RSS {got.started_mb:.0f} MB started, "
        f"{got.peak_mb:.0f} MB at the peak, {got.after_mb:.0f} MB {QUIET_S:g} s after"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
