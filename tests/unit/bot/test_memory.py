"""bot.memory: the serving process hands memory back after bursts (glibc), a no-op elsewhere."""

from __future__ import annotations

import ctypes
import sys

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
