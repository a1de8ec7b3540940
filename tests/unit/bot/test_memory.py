"""bot.memory: the serving process hands memory back after bursts (glibc), a no-op elsewhere."""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import weakref
from collections.abc import Iterator

import pytest

from bot import memory

GLIBC = memory._glibc() is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_rss_is_read_from_proc() -> None:
    rss = memory.rss_mib()
    assert rss is not None
    assert 10 < rss < 10_000


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_a_freed_burst_is_handed_back() -> None:
    """Small blocks freed under one still in use stay in the heap (RSS keeps the peak) until
    trimmed."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    memory.trim()
    before = memory.rss_mib()
    blocks = [libc.malloc(1000) for _ in range(100_000)]  # ~100 MB below the mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 1000)
    pin = libc.malloc(1000)  # above them all: the heap's top cannot shrink past it
    for block in blocks:
        libc.free(block)
    peak = memory.rss_mib()
    assert before is not None
    assert peak is not None
    assert peak - before > 50
    floor = memory.trim_after_growth(before)
    libc.free(pin)
    assert floor is not None
    assert floor - before < 25


def test_no_trim_while_rss_stays_near_its_floor() -> None:
    rss = memory.rss_mib()
    if rss is None:
        pytest.skip("no /proc here")
    assert rss == pytest.approx(memory.trim_after_growth(rss + 1.0), abs=8.0)


def test_taming_twice_starts_one_thread() -> None:
    first, second = memory.tame(every_s=3600), memory.tame(every_s=3600)
    assert first == second == GLIBC
    assert len(memory._running) == (1 if GLIBC else 0)


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector on, as in a serving process; left as the test found it."""
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The collector's thresholds, put back as the test found them."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


@pytest.mark.usefixtures("collector_on")
def test_a_paused_pass_starts_no_full_walk_and_young_collections_go_on(
    thresholds: tuple[int, int, int],
) -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    young, middle, _ = thresholds
    with memory.full_walks_paused():
        assert gc.isenabled()
        assert gc.get_threshold() == (young, middle, memory.NEVER)
        freed = threading.Event()
        weakref.finalize(Cycle(), freed.set)  # cyclic garbage: refcounting cannot free it
        # survivors: they start young collections
        kept: list[list[int]] = [[] for _ in range(4 * young)]
        assert freed.is_set(), "a young collection during the pass freed the cycle"
        del kept
    assert gc.get_threshold() == thresholds


@pytest.mark.usefixtures("collector_on")
def test_the_end_of_a_pass_walks_nothing() -> None:
    """What the pass and the requests served meanwhile left is walked young collection by
    young collection during the pass, never all at once as it ends (that stalled every
    thread)."""
    walks: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            walks.append(info["generation"])

    pass_ = memory.full_walks_paused()
    pass_.__enter__()
    kept: list[list[int]] = [[] for _ in range(1000)]
    gc.callbacks.append(note)
    try:
        pass_.__exit__(None, None, None)
    finally:
        gc.callbacks.remove(note)
    assert walks == []
    assert len(kept) == 1000


@pytest.mark.usefixtures("thresholds")
def test_overlapping_passes_give_the_threshold_back_once_both_ended() -> None:
    """Two threads' passes overlap, the first ending before the second."""
    full = gc.get_threshold()[2]
    inside, first_done = threading.Event(), threading.Event()
    seen: list[int] = []

    def second() -> None:
        with memory.full_walks_paused():
            inside.set()
            first_done.wait(10)
            seen.append(gc.get_threshold()[2])  # the first ended: still paused, this one runs

    thread = threading.Thread(target=second)
    with memory.full_walks_paused():
        thread.start()
        assert inside.wait(10)
    first_done.set()
    thread.join(10)
    assert seen == [memory.NEVER]
    assert gc.get_threshold()[2] == full


def test_a_schedule_begun_during_a_pass_gives_back_the_thresholds_before_both(
    thresholds: tuple[int, int, int],
) -> None:
    with memory.full_walks_paused():
        assert memory.schedule_collector(every_s=60)
    try:
        assert gc.get_threshold()[2] == memory.NEVER  # the schedule's, after the pass
    finally:
        memory.unschedule_collector()
    assert gc.get_threshold() == thresholds


def test_a_schedule_ended_during_a_pass_leaves_full_walks_paused_until_it_ends(
    thresholds: tuple[int, int, int],
) -> None:
    assert memory.schedule_collector(every_s=60)
    try:
        with memory.full_walks_paused():
            memory.unschedule_collector()
            assert gc.get_threshold() == (*thresholds[:2], memory.NEVER)
    finally:
        memory.unschedule_collector()
    assert gc.get_threshold() == thresholds


def test_the_schedule_takes_full_walks_off_the_allocation_counts() -> None:
    """While scheduled, allocations start young collections only; the thread walks everything
    every period, so a cycle that reached the old generation is still freed; stopping gives
    the collector back its thresholds."""
    before = gc.get_threshold()
    assert memory.schedule_collector(every_s=0.05)
    try:
        assert not memory.schedule_collector()  # once per process
        young, middle, full = gc.get_threshold()
        assert young >= memory.YOUNG_THRESHOLD
        assert middle == memory.MIDDLE_THRESHOLD
        assert full >= 1 << 30

        class Node:
            other: object = None

        a, b = Node(), Node()
        a.other, b.other = b, a
        gc.collect(1)
        gc.collect(1)  # survived twice: in the old generation, which allocations never walk
        gone = threading.Event()
        weakref.finalize(a, gone.set)
        del a, b
        [[] for _ in range(200_000)]  # young collections only
        assert gone.wait(5), "the scheduled full collection freed the cycle"
    finally:
        memory.unschedule_collector()
    assert gc.get_threshold() == before
