"""GPUBOT_ENFORCER=slurm: a reclaim ends the holder's Slurm jobs on the lease's GPUs, a drain
drains the node in Slurm. Through the Slurm client commands on PATH, each with a timeout:

    scancel --signal=TERM --full JOB      first: every step of the job and its batch script
                                          get SIGTERM, so the work can checkpoint
    squeue -h -j JOB -o %T                once the grace is over: is the job still there?
    scancel JOB                           if it is: Slurm ends it (SIGTERM, KillWait, SIGKILL)
    scontrol update nodename=NODE state=drain reason=...

The grace is waited out between sweeps, never inside one: the step that sends SIGTERM keeps
the time, and the first step after the grace checks and cancels.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bot.enforcers.model import SLURM, Order, Step, shorten

COMMAND_TIMEOUT_S = 30.0
# Job states in which the job has ended or is ending by itself: nothing left to cancel.
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "COMPLETING",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
# What scancel and squeue answer for a job slurmctld no longer knows or that is finishing.
_NO_SUCH_JOB = ("invalid job id", "already completing or completed")

SIGNALLED = "signalled"  # SIGTERM sent, the grace runs
GONE = "gone"  # not there (or already ending) when it was to be signalled
TERMINATED = "terminated"  # ended within the grace
CANCELLED = "cancelled"  # still there after the grace: scancel


@dataclass(frozen=True)
class Ran:
    """One command and how it ended; `code` None: it did not run to an end (`why` says)."""

    argv: tuple[str, ...]
    code: int | None
    out: str = ""
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def no_such_job(self) -> bool:
        said = self.why.lower()
        return self.code not in (0, None) and any(text in said for text in _NO_SUCH_JOB)

    def shown(self) -> str:
        """The command as the audit shows it, with its outcome."""
        line = " ".join(self.argv)
        if self.code is None:
            return f"{line}: {self.why}"
        if self.code == 0:
            return f"{line}: ok" + (f" ({shorten(self.out, 60)})" if self.out.strip() else "")
        return f"{line}: exit {self.code}" + (f": {shorten(self.why)}" if self.why else "")


def run(argv: Sequence[str], timeout_s: float) -> Ran:
    """Run one Slurm command without a shell; a missing executable or a timeout is an answer
    (`code` None), never an exception."""
    args = tuple(argv)
    try:
        done = subprocess.run(  # noqa: S603 - a fixed argv, no shell
            args, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        return Ran(args, None, why=f"{args[0]} not found: install the Slurm client on PATH")
    except subprocess.TimeoutExpired:
        return Ran(args, None, why=f"no answer within {timeout_s:g} s")
    except OSError as exc:
        return Ran(args, None, why=f"cannot run {args[0]}: {exc.strerror or exc}")
    return Ran(args, done.returncode, done.stdout, done.stderr.strip())


class SlurmEnforcer:
    """Cancels jobs and drains nodes through scancel, squeue and scontrol."""

    name = SLURM

    def __init__(self, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def reclaim(self, order: Order, now: datetime) -> Step:
        jobs: dict[str, str] = dict(order.progress.get("jobs", {}))
        termed_at: str | None = order.progress.get("termed_at")
        commands: list[str] = []
        errors: list[str] = []
        for job in dict.fromkeys(str(t["job"]) for t in order.targets if t.get("job")):
            if job not in jobs:
                ran = self._run("scancel", "--signal=TERM", "--full", job)
                commands.append(ran.shown())
                if ran.ok:
                    jobs[job] = SIGNALLED
                    termed_at = termed_at or now.isoformat()
                elif ran.no_such_job:
                    jobs[job] = GONE
                else:
                    errors.append(f"job {job}: {ran.shown()}")
        waiting = [job for job, state in jobs.items() if state == SIGNALLED]
        grace_over = termed_at is not None and now >= datetime.fromisoformat(termed_at) + timedelta(
            seconds=order.term_grace_s
        )
        if waiting and grace_over:
            for job in waiting:
                settled, error = self._end_after_grace(job, commands)
                if settled:
                    jobs[job] = settled
                else:
                    errors.append(f"job {job}: {error}")
        progress: dict[str, Any] = {"jobs": jobs, "termed_at": termed_at}
        results = [{"job": job, "outcome": state} for job, state in jobs.items()]
        done = not errors and all(state != SIGNALLED for state in jobs.values())
        return Step(results, commands, done, "; ".join(errors), progress)

    def _end_after_grace(self, job: str, commands: list[str]) -> tuple[str, str]:
        """(the job's final outcome, "") or ("", why it could not be settled now)."""
        asked = self._run("squeue", "-h", "-j", job, "-o", "%T")
        commands.append(asked.shown())
        if asked.no_such_job:
            return TERMINATED, ""
        if not asked.ok:
            return "", asked.shown()
        state = (asked.out.split() or [""])[0].upper()
        if not state or state in ENDED:
            return TERMINATED, ""
        ran = self._run("scancel", job)
        commands.append(ran.shown())
        if ran.ok:
            return CANCELLED, ""
        if ran.no_such_job:
            return TERMINATED, ""
        return "", ran.shown()

    def drain(self, node: str, reason: str) -> Step:
        ran = self._run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
        if ran.ok:
            return Step([{"node": node, "outcome": "drained"}], [ran.shown()], done=True)
        return Step([], [ran.shown()], done=False, error=ran.shown())

    def _run(self, *argv: str) -> Ran:
        return run(argv, self.timeout_s)
