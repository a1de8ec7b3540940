"""The node agent's hands for the `signal` enforcer: carry out one order from the bot.

Each target is pinned with a pidfd before its start time is checked, so the process that was
checked is the process that gets signalled: a PID reused since the bot saw it is refused, never
signalled. SIGTERM goes to every target at once, the grace runs once for all, then SIGKILL.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Mapping
from typing import Any

from bot.telemetry.procs import ProcReader

KILL_WAIT_S = 5.0  # after SIGKILL; a process still there is stuck in the kernel (D state)
_SAME_START_S = 0.005  # start times are in clock ticks (1/100 s): half a tick apart is the same

GONE = "gone"
TERMINATED = "terminated"
KILLED = "killed"
WOULD = "would signal"
REUSED = "refused: pid reused"


def carry_out(
    order: Mapping[str, Any],
    procs: ProcReader,
    *,
    dry_run: bool = False,
    kill_wait_s: float = KILL_WAIT_S,
) -> list[dict[str, Any]]:
    """Signal the order's targets; one `{pid, outcome}` per target, in the order's order."""
    grace_s = float(order.get("term_grace_s", 30))
    dry = dry_run or bool(order.get("dry_run", False))
    targets = [t for t in order.get("targets", []) if isinstance(t, Mapping)]
    outcome: dict[int, str] = {}
    termed: list[tuple[int, int]] = []  # (pid, pidfd) sent SIGTERM
    pids: list[int] = []
    try:
        for target in targets:
            pid, started, user = target.get("pid"), target.get("started"), target.get("user")
            if not isinstance(pid, int) or not isinstance(started, int | float):
                continue  # the bot never writes such a target; nothing to report it under
            pids.append(pid)
            if pid in outcome or any(pid == p for p, _ in termed):
                continue
            found, fd = _pin(pid, float(started), user, procs)
            if fd is None:
                outcome[pid] = found
            elif dry:
                os.close(fd)
                outcome[pid] = WOULD
            elif (sent := _send(fd, signal.SIGTERM)) is not None:
                os.close(fd)
                outcome[pid] = sent
            else:
                termed.append((pid, fd))
        deadline = time.monotonic() + grace_s
        survivors = []
        for pid, fd in termed:
            if _exited(fd, deadline - time.monotonic()):
                outcome[pid] = TERMINATED
            else:
                survivors.append((pid, fd))
        for pid, fd in survivors:
            if _send(fd, signal.SIGKILL) == GONE:
                outcome[pid] = TERMINATED  # it went at the last moment, by itself
        deadline = time.monotonic() + kill_wait_s
        for pid, fd in survivors:
            if pid not in outcome:
                exited = _exited(fd, deadline - time.monotonic())
                outcome[pid] = KILLED if exited else "stuck: alive after SIGKILL, needs a person"
    finally:
        for _, fd in termed:
            os.close(fd)
    return [{"pid": pid, "outcome": outcome[pid]} for pid in dict.fromkeys(pids)]


def _pin(pid: int, started: float, user: object, procs: ProcReader) -> tuple[str, int | None]:
    """A pidfd on `pid` if it is still the process the bot saw; else (outcome, None)."""
    if pid <= 1 or pid == os.getpid():
        return "refused: protected pid", None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return GONE, None
    except OSError as exc:
        return f"refused: cannot open: {exc.strerror or exc}", None
    # Read /proc only now: the pidfd holds this very process, whatever happens to the PID.
    owner = procs.owner(pid)
    why = None
    if owner.started is None or _exited(fd, 0.0):
        why = GONE  # exited (a zombie waiting for its parent has exited too)
    elif abs(owner.started - started) > _SAME_START_S:
        why = REUSED
    elif owner.user != user:
        why = f"refused: now owned by {owner.user}"
    if why is not None:
        os.close(fd)
        return why, None
    return "", fd


def _send(fd: int, sig: signal.Signals) -> str | None:
    """None when sent; else the outcome that stands instead."""
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return GONE
    except PermissionError:
        return "refused: not permitted to signal"
    return None


def _exited(fd: int, timeout_s: float) -> bool:
    """Has the pinned process exited, waiting at most `timeout_s`? (A pidfd polls readable.)"""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))
