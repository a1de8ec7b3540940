"""The serving process's memory: how its heap and its garbage collector are kept.

glibc's malloc keeps what a burst of requests took (one arena per thread that allocated, each
holding its peak), so RSS stays at the burst's high-water mark long after the objects are gone.
`tame()` caps the arenas and starts a thread that hands freed memory back to the system once
RSS has grown since it last did. glibc only: elsewhere both are no-ops.

`full_walks_paused()` keeps the collector's full walks out of one large pass (the sweep), and
`schedule_collector()` makes them one every five minutes instead of whenever allocations add
up: see there.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
ARENAS = 2  # the main arena and one for every other thread: a 200-thread burst no longer
# leaves 200 arenas each holding its peak, at the cost of some lock contention in malloc
EVERY_S = 10.0  # how often RSS is looked at (a read of /proc/self/statm)
GROWTH_MIB = 16.0  # trimmed when RSS grew by this much since the last trim

_PAGE_MIB = (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096) / (1 << 20)
_started = threading.Lock()
_running: list[threading.Thread] = []


def _glibc() -> Any | None:
    """glibc's libc, or None (musl, macOS, Windows: their malloc has neither call)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap malloc's arenas; best before the process starts its threads. True when glibc took it."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def trim() -> bool:
    """Return the free memory at the top of every arena's heap to the system (malloc_trim(0));
    True when some was."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)


def rss_mib() -> float | None:
    """This process's resident set, or None where /proc is not there."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * _PAGE_MIB
    except (OSError, ValueError, IndexError):
        return None


def trim_after_growth(floor_mib: float | None, growth_mib: float = GROWTH_MIB) -> float | None:
    """Trim when RSS rose `growth_mib` over `floor_mib`; the floor to compare with next time."""
    now = rss_mib()
    if now is None:
        return None
    if floor_mib is None or now - floor_mib >= growth_mib:
        trim()
        return rss_mib()
    return min(floor_mib, now)


def tame(every_s: float = EVERY_S) -> bool:
    """Cap the arenas and keep trimming after bursts, for the life of the process (once; a
    second call does nothing). False where this is not glibc."""
    if _glibc() is None:
        return False
    with _started:
        if _running:
            return True
        limit_arenas()
        thread = threading.Thread(target=_keep_trimmed, args=(every_s,), daemon=True)
        thread.name = "gpubot-malloc-trim"
        _running.append(thread)
        thread.start()
    return True


def _keep_trimmed(every_s: float) -> None:
    floor = None
    wait = threading.Event()
    while not wait.wait(every_s):
        try:
            floor = trim_after_growth(floor)
        except Exception:  # never let the housekeeping thread take the process down with it
            log.exception("trimming the heap failed")
            return


# ---- the garbage collector during a pass ------------------------------------------------


class _Pauses:
    """The passes under way (threads may overlap), and the old generation's threshold when the
    first of them began (or as a schedule ending meanwhile left it). One lock for the
    thresholds, which passes and the schedule both set."""

    lock = threading.Lock()
    under_way = 0
    full = 0


NEVER = 1 << 30  # an old-generation threshold that allocations never reach


@contextmanager
def full_walks_paused() -> Iterator[None]:
    """Run the block with no full collection started by allocations; young ones go on.

    A sweep at 100,000 GPUs allocates millions of short-lived objects (rows, facts, decisions)
    that refcounting frees, and keeps a few hundred thousand to its end (readings, snapshots).
    The collector counts objects allocated less those freed, so a young collection comes only
    every few thousand survivors and walks no more than those: a few milliseconds. A full walk
    (every object the process holds) would come whenever the survivors reached a quarter of the
    old generation: with those, collections took a third of the pass. Turning the whole
    collector off for the pass, as it once was, cost more where it is felt: the one young
    collection at its end walked everything the pass and the pushes served meanwhile had left,
    and stalled every thread for 0.3 s at 100,000 GPUs with agents pushing. Passes that overlap
    (threads) pause together; the last to end gives the old generation its threshold back,
    unless `schedule_collector` has since taken full walks off the counts for good.
    """
    with _Pauses.lock:
        if _Pauses.under_way == 0:
            young, middle, _Pauses.full = gc.get_threshold()
            gc.set_threshold(young, middle, NEVER)
        _Pauses.under_way += 1
    try:
        yield
    finally:
        with _Pauses.lock:
            _Pauses.under_way -= 1
            if _Pauses.under_way == 0 and _Schedule.thread is None:
                young, middle, _ = gc.get_threshold()
                gc.set_threshold(young, middle, _Pauses.full)


# ---- full collections at chosen moments -------------------------------------------------

YOUNG_THRESHOLD = 10_000  # allocations between young collections (Python's default is 700)
MIDDLE_THRESHOLD = 1  # the middle generation is walked once it passed this many (default 10)
FULL_EVERY_S = 300.0  # the one full collection of every five minutes


class _Schedule:
    lock = _Pauses.lock
    thread: threading.Thread | None = None
    stop = threading.Event()
    thresholds: tuple[int, int, int] | None = None


def schedule_collector(every_s: float = FULL_EVERY_S) -> bool:
    """Take the collector's full walks off its allocation counts and make them one every
    `every_s`, from a thread of their own; young collections go on as before, less often.

    A full collection stops every thread while it walks every object the process holds. In a
    bot that keeps a reading per GPU (100,000 of them on a large fleet), Python starts one
    whenever the objects that survived to the old generation since the last one reach a
    quarter of it: agents' pushes replace the readings all the time, so that came every few
    seconds, and each stalled the pushes and commands under way (the tail of agent ingest).
    Cycles that reach the old generation are still freed, within `every_s`. The middle
    generation is walked after every second young collection, not every eleventh: it holds
    two young collections' survivors, not ten (a sweep's readings and snapshots among them),
    and its walk stalled every thread for up to 0.25 s at 100,000 GPUs, against 0.06-0.09 s
    now. Once per process; False when a schedule already runs."""
    with _Schedule.lock:
        if _Schedule.thread is not None:
            return False
        young, middle, full = gc.get_threshold()
        if _Pauses.under_way:  # a pass paused full walks: give back the threshold before it
            full = _Pauses.full
        _Schedule.thresholds = (young, middle, full)
        # The old generation's count never reaches this: only the thread below walks it.
        gc.set_threshold(max(young, YOUNG_THRESHOLD), MIDDLE_THRESHOLD, NEVER)
        _Schedule.stop.clear()
        thread = threading.Thread(target=_collect_every, args=(every_s,), daemon=True)
        thread.name = "gpubot-gc"
        _Schedule.thread = thread
        thread.start()
    return True


def unschedule_collector() -> None:
    """Stop the schedule and give the collector back its own thresholds (tests, benchmarks)."""
    with _Schedule.lock:
        thread, _Schedule.thread = _Schedule.thread, None
        _Schedule.stop.set()
        if _Schedule.thresholds is not None:
            young, middle, full = _Schedule.thresholds
            if _Pauses.under_way:  # full walks stay paused until the last pass ends
                _Pauses.full, full = full, NEVER
            gc.set_threshold(young, middle, full)
            _Schedule.thresholds = None
    if thread is not None:
        thread.join()


def _collect_every(every_s: float) -> None:
    while not _Schedule.stop.wait(every_s):
        try:
            gc.collect()
        except Exception:  # never let housekeeping take the process down with it
            log.exception("a scheduled garbage collection failed")
            return
