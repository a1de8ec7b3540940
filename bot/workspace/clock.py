"""The demo clock: real time plus an offset that only the demo's fast-forward moves.

The services, the deliverer, the sweep, the simulated fleet and the local Slack workspace all read
it, so a fast-forwarded hour passes for all of them alike and for nothing else in the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta


def _real() -> datetime:
    return datetime.now(UTC)


class DemoClock:
    """Call it for the demo's now (aware UTC); `advance` jumps it ahead, never back."""

    def __init__(self, real: Callable[[], datetime] = _real) -> None:
        self._real = real
        self._offset = timedelta(0)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._real() + self._offset

    def timestamp(self) -> float:
        """Seconds since the epoch, for the local Slack workspace (message ts, token ages)."""
        return self().timestamp()

    @property
    def offset(self) -> timedelta:
        """How far the demo runs ahead of real time."""
        with self._lock:
            return self._offset

    def advance(self, by: timedelta) -> datetime:
        if by < timedelta(0):
            raise ValueError("the demo clock only moves forward")
        with self._lock:
            self._offset += by
            return self._real() + self._offset
