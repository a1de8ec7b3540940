"""The node agent's hands for the `signal` enforcer: carry out one order from the bot.

The whole order is validated before anything is signalled: a malformed one is refused as a
whole. Each target is pinned with a pidfd before its start time and its owner are checked, so
the process that was checked is the process that gets signalled: a PID reused since the bot
saw it is refused, never signalled, and so is a process of a system account or of a uid below
`min_uid`, whatever the order says. SIGTERM goes to every target at once, the grace runs once
for all, then SIGKILL.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bot.telemetry.model import MAX_EPOCH_S, MAX_ID, MAX_INDEX, MAX_PID, MAX_TARGETS
from bot.telemetry.procs import Owner, ProcReader
from rules.schema import is_system_account

KILL_WAIT_S = 5.0  # after SIGKILL; a process still there is stuck in the kernel (D state)
MAX_GRACE_S = 3600.0
MIN_UID = 1000  # the first uid useradd gives a person on Debian, Ubuntu and Red Hat
_SAME_START_S = 0.005  # start times are in clock ticks (1/100 s): half a tick apart is the same

GONE = "gone"
TERMINATED = "terminated"
KILLED = "killed"
WOULD = "would signal"
REUSED = "refused: pid reused"


class OrderError(ValueError):
    """An order that cannot be carried out as written; nothing was signalled. One line."""


@dataclass(frozen=True, slots=True)
class Target:
    pid: int
    started: float  # epoch seconds, as the agent's ProcReader read them
    user: str


@dataclass(frozen=True, slots=True)
class Order:
    """An enforcement order that passed every check of `parse_order`."""

    id: int
    targets: tuple[Target, ...]
    term_grace_s: float
    dry_run: bool


def parse_order(order: Mapping[str, Any]) -> Order:
    """The order, every field checked: finite numbers in range, known kinds; OrderError says
    the first thing wrong. (A NaN start time would pass every comparison of the PID-reuse
    check, and a NaN grace would fail only after SIGTERM was sent.)"""
    order_id = _whole(order.get("id"), "id", 1, MAX_ID)
    grace = order.get("term_grace_s")
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise OrderError(f"term_grace_s: expected a number, got {_show(grace)}")
    # Range checks written so NaN fails them (every comparison with NaN is False), and no
    # isfinite(): it overflows on a 400-digit integer.
    if not 0 <= grace <= MAX_GRACE_S:
        raise OrderError(f"term_grace_s: expected 0 to {MAX_GRACE_S:g}, got {_show(grace)}")
    dry_run = order.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise OrderError(f"dry_run: expected true or false, got {_show(dry_run)}")
    targets = order.get("targets")
    if not isinstance(targets, list) or len(targets) > MAX_TARGETS:
        raise OrderError(f"targets: expected a list of at most {MAX_TARGETS}")
    return Order(order_id, tuple(_target(t, k) for k, t in enumerate(targets)), grace, dry_run)


def _target(target: object, k: int) -> Target:
    where = f"targets[{k}]"
    if not isinstance(target, Mapping):
        raise OrderError(f"{where}: expected an object")
    pid = _whole(target.get("pid"), f"{where}.pid", 1, MAX_PID)
    started = target.get("started")
    if isinstance(started, bool) or not isinstance(started, int | float):
        raise OrderError(f"{where}.started: expected a number, got {_show(started)}")
    if not 0 < started <= MAX_EPOCH_S:
        raise OrderError(f"{where}.started: expected epoch seconds, got {_show(started)}")
    user = target.get("user")
    if not isinstance(user, str) or not 0 < len(user) <= 64:
        raise OrderError(f"{where}.user: expected an account name, got {_show(user)}")
    if "gpu" in target:
        _whole(target["gpu"], f"{where}.gpu", 0, MAX_INDEX)
    return Target(pid, float(started), user)


def _whole(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OrderError(f"{where}: expected a whole number {low} to {high}, got {_show(value)}")
    return value


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def order_pids(order: Mapping[str, Any]) -> list[int]:
    """The distinct in-range pids an order names, however malformed the rest: what a refusal
    can be reported under."""
    targets = order.get("targets")
    pids = []
    for target in targets[:MAX_TARGETS] if isinstance(targets, list) else []:
        pid = target.get("pid") if isinstance(target, Mapping) else None
        if isinstance(pid, int) and not isinstance(pid, bool) and 1 <= pid <= MAX_PID:
            pids.append(pid)
    return list(dict.fromkeys(pids))


def refused(order: Mapping[str, Any], why: str) -> list[dict[str, Any]]:
    """The results of an order refused as a whole: `refused: why` for each pid it names."""
    return [{"pid": pid, "outcome": f"refused: {why}"[:200]} for pid in order_pids(order)]


def carry_out(
    order: Mapping[str, Any],
    procs: ProcReader,
    *,
    dry_run: bool = False,
    kill_wait_s: float = KILL_WAIT_S,
    min_uid: int = MIN_UID,
) -> list[dict[str, Any]]:
    """Signal the order's targets; one `{pid, outcome}` per target, in the order's order.
    A malformed order signals nothing: each pid it names is `refused: malformed order: ...`."""
    try:
        checked = parse_order(order)
    except OrderError as exc:
        return refused(order, f"malformed order: {exc}")
    outcome: dict[int, str] = {}
    termed: list[tuple[int, int]] = []  # (pid, pidfd) sent SIGTERM
    try:
        for target in checked.targets:
            if target.pid in outcome or any(target.pid == p for p, _ in termed):
                continue
            found, fd = _sigterm(target, procs, dry=dry_run or checked.dry_run, min_uid=min_uid)
            if fd is None:
                outcome[target.pid] = found
            else:
                termed.append((target.pid, fd))
        _wait_then_kill(termed, checked.term_grace_s, kill_wait_s, outcome)
    finally:
        for _, fd in termed:
            os.close(fd)
    pids = dict.fromkeys(target.pid for target in checked.targets)
    return [{"pid": pid, "outcome": outcome[pid]} for pid in pids]


def _sigterm(
    target: Target, procs: ProcReader, *, dry: bool, min_uid: int
) -> tuple[str, int | None]:
    """SIGTERM the target: ("", its pidfd) when sent, else (the outcome that settles it, None)."""
    found, fd = _pin(target, procs, min_uid)
    if fd is None:
        return found, None
    if dry:
        os.close(fd)
        return WOULD, None
    sent = _send(fd, signal.SIGTERM)
    if sent is not None:
        os.close(fd)
        return sent, None
    return "", fd


def _wait_then_kill(
    termed: list[tuple[int, int]], grace_s: float, kill_wait_s: float, outcome: dict[int, str]
) -> None:
    """Wait out the grace for what was sent SIGTERM, SIGKILL what is left and wait for that;
    each pid's outcome lands in `outcome`."""
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


def _pin(target: Target, procs: ProcReader, min_uid: int) -> tuple[str, int | None]:
    """A pidfd on the target if it is still the process the bot saw and one the agent may
    signal; else (outcome, None)."""
    if target.pid <= 1 or target.pid == os.getpid():
        return "refused: protected pid", None
    if is_system_account(target.user):
        return f"refused: {target.user} is a system account", None
    try:
        fd = os.pidfd_open(target.pid)
    except ProcessLookupError:
        return GONE, None
    except OSError as exc:
        return f"refused: cannot open: {exc.strerror or exc}", None
    # Read /proc only now: the pidfd holds this very process, whatever happens to the PID.
    try:
        owner = procs.owner(target.pid)
    except BaseException:
        os.close(fd)
        raise
    why = _why_not(target, owner, fd, procs, min_uid)
    if why is not None:
        os.close(fd)
        return why, None
    return "", fd


def _why_not(target: Target, owner: Owner, fd: int, procs: ProcReader, min_uid: int) -> str | None:
    """Why the pinned process may not be signalled (gone, another process now, a protected
    owner); None when it may."""
    if owner.started is None or _exited(fd, 0.0):
        return GONE  # exited (a zombie waiting for its parent has exited too)
    if abs(owner.started - target.started) > _SAME_START_S:
        return REUSED
    if not owner.uids:
        return "refused: its owner cannot be read"
    if (low := min(owner.uids)) < min_uid:
        return f"refused: uid {low} is below {min_uid}"
    if system := [n for u in owner.uids if is_system_account(n := procs.user_name(u))]:
        return f"refused: runs as the system account {system[0]}"
    if owner.user != target.user:
        return f"refused: now owned by {owner.user}"
    return None


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
