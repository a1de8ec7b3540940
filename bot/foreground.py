"""Requests someone waits on go before the passes over the whole fleet that nobody waits on.

One process has one interpreter lock. While a sweep of 100,000 GPUs computes for seconds, an
agent's push needs that lock a handful of times (to read the request, to verify it, to record
its nonce, to answer), and each time it waits for the interpreter to take the lock from the
sweep: up to a switch interval (5 ms) per hand-over, and the sweep takes it back as soon as the
push waits on the database. At hundreds of pushes a second they fell seconds behind.

The HTTP front marks each push `serving()` from its arrival to its answer. A pass calls
`give_way()` between chunks of its work: while a request is being served it waits, without the
lock, until none is (at most `GIVE_WAY_S` at a time, so the pass always moves on). A pass runs
`in_background()`, which shortens the switch interval meanwhile, so a request that arrives in
the middle of a chunk gets the lock in a fraction of a millisecond. The pass's own work is the
same; only its wall time stretches by the time it left to the requests.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

GIVE_WAY_S = 0.02  # the longest one give_way() waits for the requests in flight
SWITCH_S = 0.0001  # the switch interval while a pass runs (CPython's default is 0.005)

_lock = threading.Lock()
_served = 0  # requests between arrival and answer
_idle = threading.Event()  # set while none is
_idle.set()
_passes = 0  # passes in_background() now
_switch_before: float | None = None


@contextmanager
def serving() -> Iterator[None]:
    """Mark a request someone waits on, from its arrival to its answer."""
    global _served  # noqa: PLW0603 - one interpreter lock per process, so one count per process
    with _lock:
        _served += 1
        _idle.clear()
    try:
        yield
    finally:
        with _lock:
            _served -= 1
            if not _served:
                _idle.set()


def give_way(most_s: float = GIVE_WAY_S) -> None:
    """Between chunks of a pass: let the requests being served finish first, for at most
    `most_s`; returns at once when there are none."""
    if not _idle.is_set():
        _idle.wait(most_s)


@contextmanager
def in_background() -> Iterator[None]:
    """Run a pass with the short switch interval (restored when the last pass ends)."""
    global _passes, _switch_before  # noqa: PLW0603 - the switch interval is per process too
    with _lock:
        if not _passes:
            _switch_before = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_S, _switch_before))
        _passes += 1
    try:
        yield
    finally:
        with _lock:
            _passes -= 1
            if not _passes and _switch_before is not None:
                sys.setswitchinterval(_switch_before)
                _switch_before = None
