"""The agent's enforcement against real child processes and the real /proc: SIGTERM, SIGKILL
after the grace, a reused PID refused, a process already gone, a dry run that signals nothing; a
malformed order signals nothing at all, and system accounts and low uids are never signalled."""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.agent.enforcer import carry_out
from bot.telemetry.procs import ProcReader
from tests.unit.agent.builders import AGENT_MIN_UID, AS_ROOT, CHILD_UID, sleeper, spawn

IGNORES_TERM = "trap '' TERM; echo ready; exec sleep 60"  # exec'd, sleep keeps SIGTERM ignored


def stubborn(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    child = spawn(children, ["sh", "-c", IGNORES_TERM])
    assert child.stdout is not None
    assert b"ready\n" == child.stdout.readline()  # SIGTERM is ignored from here on
    return child


def an_order(
    procs: ProcReader,
    *kids: subprocess.Popen[bytes],
    started: float | None = None,
    grace_s: float = 0.5,
    dry_run: bool = False,
) -> dict[str, Any]:
    targets = []
    for child in kids:
        owner = procs.owner(child.pid)
        assert owner.started is not None
        targets.append(
            {
                "gpu": 0,
                "pid": child.pid,
                "started": owner.started if started is None else started,
                "user": owner.user,
            }
        )
    return {"id": 1, "targets": targets, "term_grace_s": grace_s, "dry_run": dry_run}


def enforce(order: dict[str, Any], procs: ProcReader, **options: Any) -> list[dict[str, Any]]:
    return carry_out(order, procs, min_uid=options.pop("min_uid", AGENT_MIN_UID), **options)


def running(child: subprocess.Popen[bytes]) -> bool:
    time.sleep(0.05)
    return child.poll() is None


def test_a_process_that_heeds_sigterm_is_terminated(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """`sleep` dies of SIGTERM within the grace."""
    child = sleeper(children)
    assert [{"pid": child.pid, "outcome": "terminated"}] == enforce(an_order(procs, child), procs)
    assert -15 == child.wait(timeout=5)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """A child ignoring SIGTERM survives the 0.5 s grace, then SIGKILL ends it."""
    child = stubborn(children)
    began = time.monotonic()
    results = enforce(an_order(procs, child, grace_s=0.5), procs)
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
    assert [{"pid": child.pid, "outcome": "refused: pid reused"}] == enforce(order, procs)
    assert running(child)


def test_a_process_that_is_gone_is_reported_gone(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """Exited and reaped before the order arrived: nothing to signal."""
    child = sleeper(children)
    order = an_order(procs, child)
    child.kill()
    child.wait()
    assert [{"pid": child.pid, "outcome": "gone"}] == enforce(order, procs)


@pytest.mark.parametrize("where", ["order", "agent"])
def test_a_dry_run_signals_nothing(
    procs: ProcReader, children: list[subprocess.Popen[bytes]], where: str
) -> None:
    """A dry run, ordered by the bot or forced by the agent's --dry-run, leaves it running."""
    child = sleeper(children)
    order = an_order(procs, child, dry_run=where == "order")
    results = enforce(order, procs, dry_run=where == "agent")
    assert [{"pid": child.pid, "outcome": "would signal"}] == results
    assert running(child)


def nan_started(order: dict[str, Any]) -> None:
    order["targets"][0]["started"] = math.nan


def second_target(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(order: dict[str, Any]) -> None:
        order["targets"].append({"gpu": 1, "pid": 4242, "started": 1.7e9, "user": "x", **fields})

    return change


MALFORMED: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (nan_started, "targets[0].started: expected epoch seconds, got nan"),
    (lambda o: o.update(term_grace_s=math.nan), "term_grace_s: expected 0 to 3600, got nan"),
    (lambda o: o.update(term_grace_s=math.inf), "term_grace_s: expected 0 to 3600, got inf"),
    (lambda o: o.update(term_grace_s=-1), "term_grace_s: expected 0 to 3600, got -1"),
    (lambda o: o.update(term_grace_s=10**400), "term_grace_s: expected 0 to 3600, got 1000"),
    (lambda o: o.update(term_grace_s="30"), "term_grace_s: expected a number, got '30'"),
    (lambda o: o.pop("term_grace_s"), "term_grace_s: expected a number, got None"),
    (lambda o: o.update(dry_run="no"), "dry_run: expected true or false"),
    (lambda o: o.update(id=True), "id: expected a whole number"),
    (second_target(pid=2**31), "targets[1].pid: expected a whole number 1 to 4194304"),
    (second_target(pid=0), "targets[1].pid: expected a whole number 1 to 4194304"),
    (second_target(pid=4242.0), "targets[1].pid: expected a whole number"),
    (second_target(started=-math.inf), "targets[1].started: expected epoch seconds"),
    (second_target(started=None), "targets[1].started: expected a number"),
    (second_target(user=None), "targets[1].user: expected an account name"),
    (second_target(gpu=4096), "targets[1].gpu: expected a whole number 0 to 1023"),
    (lambda o: o["targets"].append("4242"), "targets[1]: expected an object"),
]


@pytest.mark.parametrize(("change", "why"), MALFORMED)
def test_a_malformed_order_signals_nothing_at_all(
    procs: ProcReader,
    children: list[subprocess.Popen[bytes]],
    change: Callable[[dict[str, Any]], None],
    why: str,
) -> None:
    """The whole order is checked before the first signal: a NaN anywhere (which passes every
    comparison), a pid past PID_MAX_LIMIT, a grace that is not a number, and the valid target
    beside it is not signalled either; each pid the order names is reported refused."""
    child = sleeper(children)
    order = an_order(procs, child)
    change(order)
    results = enforce(order, procs)
    assert results
    assert {child.pid} <= {r["pid"] for r in results}
    assert all(r["outcome"].startswith(f"refused: malformed order: {why}") for r in results)
    assert running(child)


def test_targets_that_are_not_a_list_are_refused_with_nothing_to_report(
    procs: ProcReader,
) -> None:
    order = {"id": 1, "targets": {"pid": 4242}, "term_grace_s": 1, "dry_run": False}
    assert [] == enforce(order, procs)


def test_a_process_of_a_uid_below_the_minimum_is_refused_and_left_running(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """The agent's --min-uid is checked against the live process, whatever the order says."""
    child = sleeper(children)
    results = enforce(an_order(procs, child), procs, min_uid=CHILD_UID + 1)
    why = f"refused: uid {CHILD_UID} is below {CHILD_UID + 1}"
    assert [{"pid": child.pid, "outcome": why}] == results
    assert running(child)


@pytest.mark.skipif(not AS_ROOT, reason="only root can start a process as root")
def test_a_process_of_root_is_refused_by_default(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    child = sleeper(children, uid=0)
    order = an_order(procs, child)
    order["targets"][0]["user"] = "alice"  # whatever the bot believed
    results = carry_out(order, procs)
    assert [{"pid": child.pid, "outcome": "refused: uid 0 is below 1000"}] == results
    assert running(child)


def test_a_process_running_as_a_system_account_is_refused_whatever_the_order_names(
    children: list[subprocess.Popen[bytes]],
) -> None:
    """The live owner's account name is read from /proc through the passwd lookup: a system
    account is refused even when the order names a person."""
    procs = ProcReader(user_name=lambda uid: "daemon")
    child = sleeper(children)
    order = an_order(procs, child)
    order["targets"][0]["user"] = "alice"
    results = enforce(order, procs)
    assert [{"pid": child.pid, "outcome": "refused: runs as the system account daemon"}] == results
    assert running(child)


@pytest.mark.parametrize("user", ["root", "nobody", "systemd-network", "_apt"])
def test_an_order_naming_a_system_account_is_refused_before_the_process_is_touched(
    procs: ProcReader, children: list[subprocess.Popen[bytes]], user: str
) -> None:
    child = sleeper(children)
    order = an_order(procs, child)
    order["targets"][0]["user"] = user
    results = enforce(order, procs)
    assert [{"pid": child.pid, "outcome": f"refused: {user} is a system account"}] == results
    assert running(child)


def test_one_order_signals_several_processes_and_reports_each_once(
    procs: ProcReader, children: list[subprocess.Popen[bytes]]
) -> None:
    """A process on two GPUs is named twice and signalled once; SIGTERM reaches all at once."""
    first, second = sleeper(children), sleeper(children)
    order = an_order(procs, first, second)
    order["targets"].append(dict(order["targets"][0], gpu=1))
    results = enforce(order, procs)
    expected = [
        {"pid": first.pid, "outcome": "terminated"},
        {"pid": second.pid, "outcome": "terminated"},
    ]
    assert expected == results


def test_a_process_with_any_uid_below_the_minimum_is_refused(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    """A setuid-root program started by a person has the person's real uid and root's
    effective one: refused. (The /proc entry is written by the test; the process is real.)"""
    child = sleeper(children)
    (tmp_path / "stat").write_text("btime 1700000000\n")
    entry = tmp_path / str(child.pid)
    entry.mkdir()
    (entry / "status").write_text(f"Uid:\t{CHILD_UID}\t0\t0\t0\n")
    (entry / "stat").write_text(f"{child.pid} (passwd) S" + " 0" * 18 + " 500 0\n")
    # The passwd entry of each uid is its number, as for a uid without one.
    procs = ProcReader(tmp_path, user_name=str, clock_ticks=100)
    order = {
        "id": 1,
        "targets": [{"pid": child.pid, "started": 1_700_000_005.0, "user": str(CHILD_UID)}],
        "term_grace_s": 1,
    }
    results = enforce(order, procs)
    assert [{"pid": child.pid, "outcome": f"refused: uid 0 is below {AGENT_MIN_UID}"}] == results
    assert running(child)
