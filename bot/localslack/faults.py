"""Injected faults: rate limits, server errors and slow answers, each consumed by one call."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class Fault:
    """What the next `times` calls to `method` get instead of a normal answer.

    A fault with status 200 only slows the call by `delay` seconds: it is then answered
    normally (like a slow Slack, the work still happens). Any other status answers
    `{"ok": false, "error": error}` after the delay and leaves the workspace untouched.
    """

    method: str
    status: int
    error: str
    retry_after: int | None
    delay: float
    times: int

    @property
    def replaces_answer(self) -> bool:
        return self.status != 200

    def answer(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        """HTTP status, JSON body and headers of the faulted answer."""
        headers = {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}
        return self.status, {"ok": False, "error": self.error}, headers


class Faults:
    """Pending faults by method (a Web API method, "response_url" or "upload"), oldest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Fault] = []

    def add(
        self,
        method: str,
        *,
        status: int | None = None,
        error: str | None = None,
        retry_after: int | None = 0,
        times: int = 1,
        delay: float = 0.0,
    ) -> Fault:
        """Queue a fault. Defaults: 429 `ratelimited` with `Retry-After: 0`; with only `delay`
        given, a slow but successful answer; 5xx answers `internal_error`."""
        if status is None:
            status = 200 if delay else 429
        if error is None:
            error = {429: "ratelimited"}.get(status, "internal_error" if status >= 500 else "")
        fault = Fault(method, status, error or "fault_injected", None, delay, times)
        if status == 429:
            fault.retry_after = retry_after
        with self._lock:
            self._pending.append(fault)
        return fault

    def take(self, method: str) -> Fault | None:
        """The fault for this call to `method`, if one is pending; counts it down."""
        with self._lock:
            for fault in self._pending:
                if fault.method == method:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._pending.remove(fault)
                    return fault
            return None

    def pending(self) -> list[Fault]:
        with self._lock:
            return list(self._pending)

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()
