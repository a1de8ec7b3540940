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
        return min(int((now - self.start) / MINUTE), len(self.states)) - 1

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

    def steady_until(self, now: datetime, stale_after: timedelta) -> datetime | None:
        """Until when the reading stays as it is at `now` at least; None when it may change
        with the next minute (idle, or about to go stale)."""
        k = self._last(now)
        s = self.states
        if k < 0 or k >= len(s) - 1 or s[k] == Minute.IDLE:
            return None
        if s[k] == Minute.UNKNOWN and self.reading(now, stale_after).fresh:
            return None  # goes stale soon
        others = (_UNKNOWN, _IDLE) if s[k] == Minute.BUSY else (_IDLE, _BUSY)
        found = [j for j in (s.find(o, k + 1) for o in others) if j >= 0]
        j = min(found, default=len(s))
        return self.start + j * MINUTE + MINUTE  # when minute j is complete

    def idle_run(self, now: datetime) -> tuple[datetime, datetime] | None:
        """While idle at `now`: since when (its stretch's first minute) and until when it
        stays idle at least (its next other minute complete); None when not idle."""
        k = self._last(now)
        s = self.states
        if k < 0 or k >= len(s) - 1 or s[k] != Minute.IDLE:
            return None
        began = max(s.rfind(_UNKNOWN, 0, k), s.rfind(_BUSY, 0, k)) + 1
        found = [j for j in (s.find(o, k + 1) for o in (_UNKNOWN, _BUSY)) if j >= 0]
        j = min(found, default=len(s))
        return self.start + began * MINUTE, self.start + j * MINUTE + MINUTE
