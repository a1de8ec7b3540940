"""The record of every request the local Slack received, and waiting for one to arrive.

Bolt runs listener work after `ack()` on a thread pool, so tests wait on this log; they never sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Call:
    """One request: the Web API method (or "response_url", "upload"), its parsed arguments, and
    what the local Slack answered. `faulted` means an injected fault answered instead."""

    method: str
    args: dict[str, Any]
    headers: dict[str, str]
    at: float
    faulted: bool = False
    status: int = 200
    response: dict[str, Any] = field(default_factory=dict)
    target: str = ""  # a response_url's token, an upload's file id

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.response.get("ok", True))


class CallLog:
    """Thread-safe, append-only until `clear()`; recorded after the call changed the workspace."""

    def __init__(self) -> None:
        self._calls: list[Call] = []
        self._changed = threading.Condition()

    def record(self, call: Call) -> None:
        with self._changed:
            self._calls.append(call)
            self._changed.notify_all()

    def all(self) -> list[Call]:
        with self._changed:
            return list(self._calls)

    def of(self, method: str) -> list[Call]:
        """The calls to one method, faulted ones included, oldest first."""
        return [call for call in self.all() if call.method == method]

    def clear(self) -> None:
        with self._changed:
            self._calls.clear()

    def wait_for(
        self, method: str, predicate: Predicate | None = None, timeout: float = 5.0
    ) -> Call:
        """The first unfaulted call to `method` whose args satisfy `predicate`, waiting for it.

        Raises TimeoutError naming the methods seen so far.
        """

        def match() -> Call | None:
            for call in self._calls:
                wanted = call.method == method and not call.faulted
                if wanted and (predicate is None or predicate(call.args)):
                    return call
            return None

        # Condition.wait_for times itself with threading's clock, which freezegun leaves alone.
        with self._changed:
            found = self._changed.wait_for(match, timeout)
            if found is None:
                seen = ", ".join(call.method for call in self._calls) or "nothing"
                raise TimeoutError(f"no matching {method} call within {timeout} s; saw: {seen}")
            return found

    def __iter__(self) -> Iterator[Call]:
        return iter(self.all())

    def __len__(self) -> int:
        with self._changed:
            return len(self._calls)
