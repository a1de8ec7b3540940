"""Acks first: the work after an ack waits while other Slack requests are still being acked.

Slack gives a request 3 seconds for its ack and retries it after that; the answer that follows
has no such deadline. In one process the two compete for the same interpreter, so a burst of
commands would see each ack slowed by the decisions of the commands before it. The HTTP front
counts the requests it is dispatching (`acking()`); post-ack work calls `wait_turn()` first and
starts once no request has been in flight for `quiet`, or after `longest` whatever happens, so
a steady stream of requests delays answers by at most that much and never stops them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

QUIET_S = 0.1  # no request in flight for this long: the burst is over
LONGEST_S = 0.5  # the most an answer ever waits for acks


class AcksFirst:
    def __init__(
        self,
        *,
        quiet_s: float = QUIET_S,
        longest_s: float = LONGEST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quiet_s = quiet_s
        self.longest_s = longest_s
        self._clock = clock
        self._changed = threading.Condition()
        self._in_flight = 0
        self._last_done = -float("inf")

    @contextmanager
    def acking(self) -> Iterator[None]:
        """Around one request's dispatch, from its arrival until its ack is sent."""
        with self._changed:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._changed:
                self._in_flight -= 1
                self._last_done = self._clock()
                self._changed.notify_all()

    @property
    def in_flight(self) -> int:
        with self._changed:
            return self._in_flight

    def wait_turn(self) -> float:
        """Block until no ack is pending (for `quiet_s`) or `longest_s` has passed; the wait."""
        start = self._clock()
        with self._changed:
            while True:
                now = self._clock()
                waited = now - start
                if waited >= self.longest_s:
                    return waited
                if self._in_flight == 0:
                    calm = now - self._last_done
                    if calm >= self.quiet_s:
                        return waited
                    timeout = self.quiet_s - calm
                else:
                    timeout = self.longest_s - waited
                self._changed.wait(min(timeout, self.longest_s - waited))
