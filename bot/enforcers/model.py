"""What the scheduler enforcers take and give: an order's plain values in, a `Step` out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

SLURM, KUBERNETES = "slurm", "kubernetes"
MAX_SHOWN = 300  # characters of a command's output kept in the audit


class EnforcerUnavailableError(RuntimeError):
    """The enforcer cannot act as configured; the message says what to install or set."""


@dataclass(frozen=True)
class Order:
    """One node's share of a reclaim, as the enforcer sees it. `progress` is what earlier
    steps of this order kept (a Step's `progress`), empty on the first."""

    id: int
    lease: int
    node: str
    targets: Sequence[Mapping[str, Any]]
    term_grace_s: int
    progress: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """What one attempt did. `results`: one `{job|pod, outcome}` per target settled so far;
    `commands`: each command or API call with its outcome, as the audit shows it; `error`:
    why the order must be tried again ("" when nothing failed); `done`: nothing is left to do
    (False with no error: waiting, e.g. for the grace); `progress`: kept for the next step."""

    results: list[dict[str, Any]]
    commands: list[str]
    done: bool
    error: str = ""
    progress: dict[str, Any] = field(default_factory=dict)


class Enforcer(Protocol):
    @property
    def name(self) -> str: ...

    def reclaim(self, order: Order, now: datetime) -> Step:
        """Take the next step of a reclaim order."""
        ...

    def drain(self, node: str, reason: str) -> Step:
        """Keep the scheduler from placing new work on the node."""
        ...


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """One line of at most `limit` characters: what the audit keeps of an answer."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
