"""The agent's enforcement against real child processes and the real /proc: SIGTERM, SIGKILL
after the grace, a reused PID refused, a process already gone, and a dry run that signals
nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bot.enforce import carry_out
from bot.telemetry.procs import ProcReader

IGNORES_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def procs() -> ProcReader:
    return ProcReader()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def sleeper(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(["sleep", "60"])  # noqa: S607 - coreutils' sleep, a test child
    children.append(child)
    return child


def stubborn(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    script = [sys.executable, "-c", IGNORES_TERM]  # our own interpreter, our own script
    child = subprocess.Popen(script, stdout=subprocess.PIPE)  # noqa: S603 - fixed arguments
    children.append(child)
    assert child.stdout is not None
    assert b"ready\n" == child.stdout.readline()  # SIGTERM is ignored from here on
    return child


def an_order(
    procs: ProcReader,
    child: subprocess.Popen[bytes],
    *,
    started: float | None = None,
    grace_s: float = 0.5,
    dry_run: bool = False,
) -> dict[str, Any]:
    owner = procs.owner(child.pid)
    assert owner.started is not None
    target = {
        "gpu": 0,
        "pid": child.pid,
        "started": owner.started if started is None else started,
        "user": owner.user,
    }
    return {"id": 1, "targets": [target], "term_grace_s": grace_s, "dry_run": dry_run}


def running(child: subprocess.Popen[bytes]) -> bool:
    time.sleep(0.05)
    return child.poll() is None


def test_a_process_that_heeds_sigterm_is_terminated(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """`sleep` dies of SIGTERM within the grace."""
    child = sleeper(children)
    assert [{"pid": child.pid, "outcome": "terminated"}] == carry_out(an_order(procs, child), procs)
    assert -15 == child.wait(timeout=5)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """A child ignoring SIGTERM survives the 0.5 s grace, then SIGKILL ends it."""
    child = stubborn(children)
    began = time.monotonic()
    results = carry_out(an_order(procs, child, grace_s=0.5), procs)
    assert [{"pid": child.pid, "outcome": "killed"}] == results
    assert time.monotonic() - began >= 0.5
    assert -9 == child.wait(timeout=5)


def test_a_pid_whose_start_time_differs_is_refused_and_left_running(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """The order saw another process under this PID: never signal a different process."""
    child = sleeper(children)
    order = an_order(procs, child)
    order["targets"][0]["started"] -= 3600.0
    assert [{"pid": child.pid, "outcome": "refused: pid reused"}] == carry_out(order, procs)
    assert running(child)


def test_a_process_that_is_gone_is_reported_gone(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """Exited and reaped before the order arrived: nothing to signal."""
    child = sleeper(children)
    order = an_order(procs, child)
    child.kill()
    child.wait()
    assert [{"pid": child.pid, "outcome": "gone"}] == carry_out(order, procs)


@pytest.mark.parametrize("where", ["order", "agent"])
def test_a_dry_run_signals_nothing(
    procs: ProcReader, children: list[subprocess.Popen[bytes]], where: str
) -> None:
    """A dry run, ordered by the bot or forced by the agent's --dry-run, leaves it running."""
    child = sleeper(children)
    order = an_order(procs, child, dry_run=where == "order")
    results = carry_out(order, procs, dry_run=where == "agent")
    assert [{"pid": child.pid, "outcome": "would signal"}] == results
    assert running(child)
