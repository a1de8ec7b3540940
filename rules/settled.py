"""What became of a lease's warning that no longer stands: the one outcome its message shows
once it is redrawn without buttons."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from rules.marks import PARTLY_IDLE, PREEMPT, Marks


class Settled(StrEnum):
    """Why a warning no longer stands."""

    STANDS = "stands"  # it is the warning the lease stands on now
    SUPERSEDED = "superseded"  # a newer warning of the same kind replaced it
    EXTENDED = "extended"  # the lease ends later than the warning said
    GAVE_BACK = "gave_back"  # idle GPUs it named were given back
    KEPT = "kept"  # the holder chose Keep
    SNOOZED = "snoozed"  # the holder said Still using
    WITHDRAWN = "withdrawn"  # the recall it announced was withdrawn
    CLEARED = "cleared"  # what it warned of passed (the GPUs got busy again, ...)


# An expiry warning counts as answered by an extension only when the end moved by more than
# rounding: the minutes left a warning records are a float of the sweep's clock.
_MOVED = timedelta(minutes=1)


@dataclass(frozen=True)
class WarningShown:
    """A warning as it was drawn: its outbox row, its reason, when it was owed, the minutes
    left it said, and the idle GPUs ("node:index") it named."""

    outbox: int
    reason: str
    owed_at: datetime
    time_left_min: float = 0.0
    idle: tuple[str, ...] = ()


def settled(
    shown: WarningShown,
    marks: Marks,
    *,
    expires_at: datetime,
    held: Collection[str],
    snoozed_until: datetime | None,
    now: datetime,
) -> Settled:
    """What became of `shown` as the lease stands now: its marks, its end, the GPUs it holds
    ("node:index") and its snooze."""
    standing = marks.warning_outbox(shown.reason)
    if standing == shown.outbox:
        return Settled.STANDS
    if standing is not None:
        return Settled.SUPERSEDED
    if shown.reason == "expiry":
        said_end = shown.owed_at + timedelta(minutes=shown.time_left_min)
        return Settled.EXTENDED if expires_at > said_end + _MOVED else Settled.CLEARED
    if shown.reason == PREEMPT:
        return Settled.WITHDRAWN
    if shown.reason == PARTLY_IDLE and marks.kept:
        return Settled.KEPT
    if any(gpu not in held for gpu in shown.idle):
        return Settled.GAVE_BACK
    if snoozed_until is not None and snoozed_until > now and snoozed_until > shown.owed_at:
        return Settled.SNOOZED
    return Settled.CLEARED
