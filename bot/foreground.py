"""Requests someone waits on go before the passes over the whole fleet that nobody waits on.

One process has one interpreter lock. While a sweep of 100,000 GPUs computes for seconds, an
agent's push needs that lock a handful of times (to read the request, to verify it, to record
its nonce, to answer), and each time it waits for the interpreter to take the lock from the
sweep: up to a switch interval (5 ms) per hand-over, and the sweep takes it back as soon as the
push waits on the database. At hundreds of pushes a second they fell seconds behind.

The HTTP front marks each push `serving()` from the arrival of its whole body until its
answer is sent (not while its body is still arriving: a sender that stalls mid-body holds
nothing up). A pass runs `in_background()`,
which shortens the switch interval meanwhile, so a request that arrives in the middle of a
chunk gets the lock in a fraction of a millisecond; between chunks the pass calls `give_way()`:
while a request is being served it waits, without the lock, until none is (at most `GIVE_WAY_S`
at a time). A pass never waits longer in all than `SHARE` times what it has worked, so under
any stream of requests it ends within a bounded multiple of its own time (at 100,000 GPUs
and 417 pushes a second a sweep gave way for about 6 times its own time on PostgreSQL; a cap
of once its own time held pushes seconds behind there). `give_way()` outside a pass (on a
thread not `in_background()`) returns at once. The pass's own work is the same; only its wall
time stretches by the time it left to the requests.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

GIVE_WAY_S = 0.02  # the longest one give_way() waits for the requests in flight
SWITCH_S = 0.0001  # the switch interval while a pass runs (CPython's default is 0.005)
SHARE = 8  # a pass gives way at most this many times as long as it has worked

_lock = threading.Lock()
_served = 0  # requests between arrival and answer
_idle = threading.Event()  # set while none is
_idle.set()
_passes = 0  # passes in_background() now
_switch_before: float | None = None


@dataclass
class _Pass:
    started: float  # perf_counter() at its start
    waited: float = 0.0  # seconds given way so far


_here = threading.local()  # .run: the _Pass this thread runs, if any


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
    `most_s`, and in all no longer than SHARE times what the pass has worked (its first wait
    excepted); returns
    at once when none is served, or when this thread runs no pass."""
    run: _Pass | None = getattr(_here, "run", None)
    if run is None or _idle.is_set():
        return
    if run.waited:
        worked = time.perf_counter() - run.started - run.waited
        most_s = min(most_s, SHARE * worked - run.waited)
        if most_s <= 0:
            return
    started = time.perf_counter()
    _idle.wait(most_s)
    run.waited += time.perf_counter() - started


@contextmanager
def in_background() -> Iterator[None]:
    """Run a pass on this thread: it gives way to requests being served (`give_way`), with the
    short switch interval (restored when the last pass of the process ends)."""
    global _passes, _switch_before  # noqa: PLW0603 - the switch interval is per process too
    with _lock:
        if not _passes:
            _switch_before = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH_S, _switch_before))
        _passes += 1
    outer = getattr(_here, "run", None) is None
    if outer:
        _here.run = _Pass(time.perf_counter())
    try:
        yield
    finally:
        if outer:
            _here.run = None
        with _lock:
            _passes -= 1
            if not _passes and _switch_before is not None:
                sys.setswitchinterval(_switch_before)
                _switch_before = None
