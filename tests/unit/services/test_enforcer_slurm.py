"""GPUBOT_ENFORCER=slurm: the commands the enforcer runs, against fake `scancel`, `squeue` and
`scontrol` executables first on PATH that record their arguments and answer as scripted; and,
on SQLite and PostgreSQL, a reclaim and a drain carried out by the sweep job's step and
recorded in the audit."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import select

from bot.enforcers import Order
from bot.enforcers.slurm import SlurmEnforcer
from bot.services import Services
from bot.services.enforcement import MAX_TRIES
from bot.telemetry.model import ProcessInfo
from storage.db import Database
from storage.tables import EnforcementRow
from tests.builders import default_sources
from tests.unit.bot.conftest import T0, Clock
from tests.unit.services.reclaiming import STARTED, audit, reclaimed

ADA = "U0ADMIN01"
NODE = "a100-node-01"
# Each fake appends one line to calls.log: its name, then its arguments, tab-separated. Its
# answer: answers/NAME-ARG.{out,err,rc,sleep} for the first argument scripted so (a job id),
# else answers/NAME.*; nothing scripted: exit 0, silent.
FAKE = """#!/bin/sh
PATH=/usr/bin:/bin
here=$(dirname "$0")
name=$(basename "$0")
line="$name"
answer="$here/answers/$name"
for arg in "$@"; do
  line="$line	$arg"
  [ "$answer" = "$here/answers/$name" ] && [ -e "$answer-$arg.rc" ] && answer="$answer-$arg"
done
printf '%s\\n' "$line" >> "$here/calls.log"
[ -e "$answer.sleep" ] && sleep "$(cat "$answer.sleep")"
[ -e "$answer.out" ] && cat "$answer.out"
[ -e "$answer.err" ] && cat "$answer.err" >&2
[ -e "$answer.rc" ] && exit "$(cat "$answer.rc")"
exit 0
"""


class FakeSlurm:
    """The fake Slurm client: what it was asked, and what it answers."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        (bin_dir / "answers").mkdir(parents=True)
        for name in ("scancel", "squeue", "scontrol"):
            path = bin_dir / name
            path.write_text(FAKE)
            path.chmod(0o755)

    def answer(
        self,
        name: str,
        *,
        out: str = "",
        err: str = "",
        rc: int = 0,
        job: str = "",
        sleep_s: float = 0,
    ) -> None:
        """Script `name`'s answer (to the commands naming `job`, when given)."""
        stem = f"{name}-{job}" if job else name
        for suffix, text in ((".out", out), (".err", err), (".rc", str(rc))):
            (self.bin / "answers" / f"{stem}{suffix}").write_text(text)
        if sleep_s:
            (self.bin / "answers" / f"{stem}.sleep").write_text(f"{sleep_s:g}")

    def calls(self) -> list[list[str]]:
        """Each command run so far: its argv, in order; then forgotten."""
        log = self.bin / "calls.log"
        if not log.exists():
            return []
        found = [line.split("\t") for line in log.read_text().splitlines()]
        log.unlink()
        return found


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    return fake


def an_order(*jobs: str, progress: dict[str, object] | None = None) -> Order:
    targets = [
        {"gpu": k, "job": job, "pid": 4100 + k, "user": "alice"} for k, job in enumerate(jobs)
    ]
    return Order(1, 7, NODE, targets, term_grace_s=30, progress=progress or {})


# --- the contract: commands, grace, answers ------------------------------------------------------


def test_sigterm_first_then_scancel_only_what_outlived_the_grace(slurm: FakeSlurm) -> None:
    """TERM to every step of each job, once per job; nothing during the grace; after it, the
    job still running is cancelled, the ones that ended (or that slurmctld forgot) are not."""
    enforcer = SlurmEnforcer()
    first = enforcer.reclaim(an_order("101", "101", "102", "103"), T0)
    assert [
        ["scancel", "--signal=TERM", "--full", "101"],
        ["scancel", "--signal=TERM", "--full", "102"],
        ["scancel", "--signal=TERM", "--full", "103"],
    ] == slurm.calls()
    assert (False, "") == (first.done, first.error)

    order = an_order("101", "102", "103", progress=first.progress)
    during = enforcer.reclaim(order, T0 + timedelta(seconds=29))
    assert ([], False, "") == (slurm.calls(), during.done, during.error)

    slurm.answer("squeue", out="RUNNING\n", job="101")
    slurm.answer("squeue", out="COMPLETED\n", job="102")
    forgot = "slurm_load_jobs error: Invalid job id specified"
    slurm.answer("squeue", err=forgot, rc=1, job="103")
    order = an_order("101", "102", "103", progress=during.progress)
    after = enforcer.reclaim(order, T0 + timedelta(seconds=30))
    assert [
        ["squeue", "-h", "-j", "101", "-o", "%T"],
        ["scancel", "101"],
        ["squeue", "-h", "-j", "102", "-o", "%T"],
        ["squeue", "-h", "-j", "103", "-o", "%T"],
    ] == slurm.calls()
    outcomes = {r["job"]: r["outcome"] for r in after.results}
    assert {"101": "cancelled", "102": "terminated", "103": "terminated"} == outcomes
    assert (True, "") == (after.done, after.error)


def test_a_job_gone_before_sigterm_is_settled_at_once(slurm: FakeSlurm) -> None:
    """scancel says the job id is unknown: `gone`, no grace, no second command."""
    slurm.answer(
        "scancel", err="scancel: error: Kill job error on job id 55: Invalid job id specified", rc=1
    )
    step = SlurmEnforcer().reclaim(an_order("55"), T0)
    assert [["scancel", "--signal=TERM", "--full", "55"]] == slurm.calls()
    assert ([{"job": "55", "outcome": "gone"}], True) == (step.results, step.done)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            {"err": "scancel: error: Access/permission denied", "rc": 1},
            "exit 1: scancel: error: Access/permission denied",
        ),
        ({"rc": 0, "sleep_s": 5}, "no answer within 0.5 s"),
    ],
    ids=["refused", "timeout"],
)
def test_a_failing_command_is_an_error_to_retry_not_a_result(
    slurm: FakeSlurm, script: dict[str, object], expected: str
) -> None:
    """A non-zero exit Slurm does not explain as a missing job, or no answer in time: the
    order is not done, the error says what was run and how it ended."""
    slurm.answer("scancel", **script)  # type: ignore[arg-type]
    step = SlurmEnforcer(timeout_s=0.5).reclaim(an_order("77"), T0)
    assert (False, []) == (step.done, step.results)
    assert step.error.startswith("job 77: scancel --signal=TERM --full 77: ")
    assert step.error.endswith(expected)


def test_a_missing_scancel_says_to_install_the_slurm_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No scancel on PATH: the error names it and what to do."""
    monkeypatch.setenv("PATH", str(tmp_path))
    step = SlurmEnforcer().reclaim(an_order("77"), T0)
    assert "scancel not found: install the Slurm client on PATH" in step.error
    assert not step.done


def test_a_drain_runs_scontrol_with_the_reason_as_one_argument(slurm: FakeSlurm) -> None:
    """`scontrol update nodename=N state=drain reason=...`, the reason unsplit (no shell)."""
    step = SlurmEnforcer().drain(NODE, "gpubot: drained by U0ADMIN01: fan noise")
    expected = ["scontrol", "update", f"nodename={NODE}", "state=drain"]
    assert [[*expected, "reason=gpubot: drained by U0ADMIN01: fan noise"]] == slurm.calls()
    assert ([{"node": NODE, "outcome": "drained"}], True) == (step.results, step.done)


# --- through the use cases, on SQLite and PostgreSQL ---------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def services(database: Database, clock: Clock) -> Iterator[Services]:
    svc = Services.open(database, default_sources(), clock=clock, enforcer="slurm")
    yield svc
    svc.close()


PROCESSES = (
    ProcessInfo(pid=4100, user="alice", job="slurm/777", started=STARTED),  # the holder's job
    ProcessInfo(pid=4101, user="alice", job="slurm/777", started=STARTED),  # the same job
    ProcessInfo(pid=4200, user="bob", job="slurm/888", started=STARTED),  # someone else's
    ProcessInfo(pid=4300, user="alice", started=STARTED),  # the holder's, outside Slurm
    # A pushed "job" that would be an option to scancel: never handed to it.
    ProcessInfo(pid=4400, user="alice", job="slurm/--user=alice", started=STARTED),
)


def test_a_reclaim_cancels_the_holders_slurm_job_after_commit_and_the_grace(
    services: Services, clock: Clock, slurm: FakeSlurm
) -> None:
    """The reclaim orders job 777 only (bob's job and a process outside Slurm are left, and
    the audit says why); nothing runs until the sweep job's step; TERM, then after the grace
    squeue and scancel; `enforce:done` carries the job, the commands and their outcome."""
    reclaimed(services, clock, PROCESSES)
    assert [] == slurm.calls()  # nothing ran inside the reclaim's transaction
    (ordered,) = audit(services, "enforce:ordered")
    assert "1 to cancel" == ordered.outcome
    assert [{"gpu": 0, "job": "777", "pid": 4100, "user": "alice"}] == [
        {k: t[k] for k in ("gpu", "job", "pid", "user")} for t in ordered.detail["targets"]
    ]
    assert {
        4200: "belongs to bob, not the holder",
        4300: "not in a Slurm job",
        4400: "job '--user=alice' is not a job id the scheduler gives",
    } == {s["pid"]: s["why"] for s in ordered.detail["not_targeted"]}

    assert [] == services.enforce()  # TERM sent: waiting for the grace, nothing to say
    assert [["scancel", "--signal=TERM", "--full", "777"]] == slurm.calls()
    clock.advance(timedelta(seconds=31))
    slurm.answer("squeue", out="RUNNING\n")
    assert 1 == len(services.enforce())
    assert [["squeue", "-h", "-j", "777", "-o", "%T"], ["scancel", "777"]] == slurm.calls()

    (done,) = audit(services, "enforce:done")
    assert ("enforcer:slurm", "cancelled") == (done.actor, done.outcome)
    assert [{"job": "777", "outcome": "cancelled"}] == done.detail["results"]
    assert [
        "scancel --signal=TERM --full 777: ok",
        "squeue -h -j 777 -o %T: ok (RUNNING)",
        "scancel 777: ok",
    ] == done.detail["commands"]
    assert [] == services.enforce()  # settled: a later sweep runs nothing
    assert [] == slurm.calls()


def test_a_failing_scancel_is_recorded_each_time_then_given_up(
    services: Services, clock: Clock, slurm: FakeSlurm
) -> None:
    """Every failed try is an `enforce:done` row saying so; after MAX_TRIES the order is
    closed as given up and never run again."""
    reclaimed(services, clock, PROCESSES)
    slurm.answer("scancel", err="scancel: error: slurm_receive_msg: Socket timed out", rc=1)
    for _ in range(MAX_TRIES):
        services.enforce()
    assert MAX_TRIES == len(slurm.calls())
    rows = audit(services, "enforce:done")
    assert [f"failed, retry {n} of {MAX_TRIES}" for n in range(1, MAX_TRIES)] + [
        f"gave up after {MAX_TRIES} tries"
    ] == [r.outcome for r in rows]
    assert "Socket timed out" in rows[-1].detail["error"]
    with services.db.read() as session:
        (order,) = session.exec(select(EnforcementRow)).all()
    assert "done" == order.state
    assert [] == services.enforce()
    assert [] == slurm.calls()


def test_an_admin_drain_drains_the_node_in_slurm_at_the_next_sweep(
    services: Services, slurm: FakeSlurm
) -> None:
    """The drain commits first; the step runs scontrol with who and why; audited."""
    services.drain(ADA, NODE, "fan noise")
    assert [] == slurm.calls()
    assert [f"{NODE}: drained"] == services.enforce()
    reason = f"reason=gpubot: drained by {ADA}: fan noise"
    assert [["scontrol", "update", f"nodename={NODE}", "state=drain", reason]] == slurm.calls()
    (done,) = audit(services, "enforce:done")
    assert (f"node:{NODE}", "drained") == (done.subject, done.outcome)
    assert [] == services.enforce()  # carried out once


def test_a_drain_undone_before_the_sweep_never_reaches_slurm(
    services: Services, slurm: FakeSlurm
) -> None:
    """Drained, then undrained before the step ran: no scontrol, and the audit says why."""
    services.drain(ADA, NODE, "wrong node")
    services.undrain(ADA, NODE)
    assert [f"{NODE}: not carried out"] == services.enforce()
    assert [] == slurm.calls()
    (done,) = audit(services, "enforce:done")
    assert "undrained since: not carried out" == done.detail["error"]
    assert [] == services.enforce()
