"""A GPU's stored per-minute history read back as the sweep would have read it: one state a
minute (busy, idle, or unknown where no working reading was stored), and at any moment whether
it was fresh, how long it had been idle, and until when that reading holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Any

MINUTE = timedelta(minutes=1)


class Minute(IntEnum):
    """One stored minute of one GPU: no working reading, all readings idle, or busy."""

    UNKNOWN = 0
    IDLE = 1
    BUSY = 2


_UNKNOWN, _IDLE, _BUSY = b"\x00", b"\x01", b"\x02"


@dataclass(frozen=True)
class MinuteReading:
    """A GPU as the sweep would have read it, rebuilt from the stored minutes (no health or
    processes are kept per minute: healthy, nobody else's work)."""

    fresh: bool
    idle_for: timedelta
    util_pct: float | None = None
    healthy: bool = True
    health: str = "ok"
    memory_used_mib: int | None = None
    processes: tuple[Any, ...] = ()


_UNSEEN = MinuteReading(False, timedelta(0))


class GpuTrace:
    """One GPU's minutes from `start` (a minute boundary), one `Minute` byte each; what is not
    stored is unknown, and unknown is never idle (invariant 3)."""

    def __init__(self, start: datetime, states: bytes | bytearray | Sequence[int]) -> None:
        self.start = start
        self.states = bytes(states)

    def _last(self, now: datetime) -> int:
        """The last minute complete at `now` (-1: none yet)."""
        return min((now - self.start) // MINUTE, len(self.states)) - 1  # below 0: none

    def _seen(self, k: int) -> int:
        """The last minute up to `k` with a working reading (-1: none)."""
        s = self.states
        if s[k] != Minute.UNKNOWN:
            return k
        return max(s.rfind(_IDLE, 0, k), s.rfind(_BUSY, 0, k))

    def reading(self, now: datetime, stale_after: timedelta) -> MinuteReading:
        """Fresh when a working minute ended within `stale_after`; idle for the idle minutes
        in a row up to that one (a busy or unknown minute ends the stretch)."""
        k = self._last(now)
        if k < 0:
            return _UNSEEN
        seen = self._seen(k)
        if seen < 0 or now - (self.start + (seen + 1) * MINUTE) > stale_after:
            return _UNSEEN
        s = self.states
        if s[seen] != Minute.IDLE:
            return MinuteReading(True, timedelta(0))
        began = max(s.rfind(_UNKNOWN, 0, seen), s.rfind(_BUSY, 0, seen)) + 1
        return MinuteReading(True, (seen - began + 1) * MINUTE)

    def ahead(
        self, now: datetime, stale_after: timedelta
    ) -> tuple[datetime | None, datetime] | None:
        """How the reading at `now` goes on: (since when the GPU has been idle, None when it
        is not idle; until when the reading stays as it is at least, an idle one's minutes
        adding up aside: its next other minute complete). None when it may change with the
        next minute (about to go stale), or nothing is known past `now`."""
        k = self._last(now)
        s = self.states
        if k < 0 or k >= len(s) - 1:
            return None
        state = s[k]
        if state == Minute.IDLE:
            began = max(s.rfind(_UNKNOWN, 0, k), s.rfind(_BUSY, 0, k)) + 1
            j = _first(s, k + 1, _UNKNOWN, _BUSY)
            return self.start + began * MINUTE, self.start + j * MINUTE + MINUTE
        if state == Minute.UNKNOWN:
            if self.reading(now, stale_after).fresh:
                return None  # goes stale soon
            j = _first(s, k + 1, _IDLE, _BUSY)
        else:
            j = _first(s, k + 1, _UNKNOWN, _IDLE)
        return None, self.start + j * MINUTE + MINUTE  # when minute j is complete


def _first(states: bytes, start: int, one: bytes, other: bytes) -> int:
    """The first minute from `start` that is `one` or `other` (the end when none is)."""
    a, b = states.find(one, start), states.find(other, start)
    if a < 0:
        return len(states) if b < 0 else b
    return a if b < 0 or a < b else b
