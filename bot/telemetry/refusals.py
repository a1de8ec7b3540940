"""Refused requests (node agents' pushes, Slack's /slack/events), counted and logged without
letting a sender flood either: totals by reason for /metrics, and at most one log line per
sender per window, saying how many were not logged.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

log = logging.getLogger(__name__)

UNKNOWN = "(unknown)"  # the one sender every unknown node name is counted and logged under


@dataclass(slots=True)
class _Window:
    until: datetime
    suppressed: int = 0


class Refusals:
    """Thread-safe counters of refused requests, and their rate-limited log.

    `sender` must come from a bounded set (the known node names, or UNKNOWN): it keys the log
    windows. `reason` is a short code from a fixed set (`bad-signature`, `replayed` ...): it
    keys the counters, so a sender's words never become a counter of their own.
    """

    def __init__(
        self,
        clock: Callable[[], datetime],
        every: timedelta = timedelta(seconds=60),
        *,
        subject: str = "agent request",
    ) -> None:
        self.clock = clock
        self.every = every
        self.subject = subject
        self._totals: Counter[str] = Counter()
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def refused(self, sender: str, claimed: str, status: int, reason: str, message: str) -> None:
        """Count one refusal; log it unless `sender` was logged within the window."""
        now = self.clock()
        with self._lock:
            self._totals[reason] += 1
            window = self._windows.get(sender)
            if window is not None and now < window.until:
                window.suppressed += 1
                return
            suppressed = window.suppressed if window is not None else 0
            self._windows[sender] = _Window(now + self.every)
        # The name and parts of the message are the sender's choice: cut to size, and
        # escaped (repr) unless printable, so one refusal is one line whatever was sent.
        text = message[:300]
        extra = f"; {suppressed} more refused since its last line" if suppressed else ""
        log.warning(
            "%s%s refused (%d): %s%s",
            self.subject,
            f" from {claimed[:64]!r}" if claimed else "",
            status,
            text if text.isprintable() else repr(text),
            extra,
        )

    def totals(self) -> dict[str, int]:
        """Refusals so far by reason."""
        with self._lock:
            return dict(self._totals)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._totals.values())
