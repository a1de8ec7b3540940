"""What an observe-only rule's would-have reclaim turned out to be: was the lease busy again
soon after, or did the rule read it right? Pure: the storage layer counts the minutes, this
module says what they mean. Unknown telemetry is never read as idle (invariant 3)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from rules.domain import format_duration


class After(StrEnum):
    """What came of a would-have reclaim within the look-ahead."""

    BUSY = "busy again"  # a GPU of the lease worked again: the reclaim would have been wrong
    IDLE = "not busy again"  # every minute seen and idle, or the lease ended meanwhile
    UNKNOWN = "unknown"  # no working reading for part of the time, and no busy minute
    PENDING = "too recent"  # the look-ahead has not passed yet


@dataclass(frozen=True)
class Afterwards:
    """The minutes of the lease's GPUs from a would-have reclaim until the look-ahead ends
    (or the lease gave them up): how many had a working reading, how many of those were busy,
    how many there should have been; and when the lease let its last GPU go (None: it held
    one beyond the look-ahead)."""

    busy_minutes: int
    ok_minutes: int
    expected_minutes: int
    held_until: datetime | None


def after(facts: Afterwards, at: datetime, within: timedelta, until: datetime) -> After:
    """A busy minute decides; a lease that ended within the look-ahead was not busy again; a
    look-ahead that reaches past `until` is too recent; a gap in the readings is unknown."""
    if facts.busy_minutes > 0:
        return After.BUSY
    if facts.held_until is not None and facts.held_until < at + within:
        return After.IDLE
    if at + within > until:
        return After.PENDING
    if facts.ok_minutes < facts.expected_minutes:
        return After.UNKNOWN
    return After.IDLE


@dataclass(frozen=True)
class Tally:
    """The would-have reclaims of one rule, by what came of them."""

    busy: int = 0
    idle: int = 0
    unknown: int = 0
    pending: int = 0

    def add(self, what: After) -> Tally:
        return Tally(
            self.busy + (what == After.BUSY),
            self.idle + (what == After.IDLE),
            self.unknown + (what == After.UNKNOWN),
            self.pending + (what == After.PENDING),
        )

    @property
    def decided(self) -> int:
        return self.busy + self.idle

    @property
    def total(self) -> int:
        return self.decided + self.unknown + self.pending

    @property
    def false_positive_rate(self) -> float | None:
        """Busy again out of those that can be told (unknown and too recent left out)."""
        return self.busy / self.decided if self.decided else None


def false_positive_line(tally: Tally, within: timedelta) -> str:
    """ "busy again within 1h after 3 of 12 would-have reclaims (25 %)", and what was left out."""
    span = format_duration(within)
    rate = tally.false_positive_rate
    if rate is None:
        line = f"no would-have reclaim could be checked against {span} after it"
    else:
        noun = "reclaim" if tally.decided == 1 else "reclaims"
        line = (
            f"busy again within {span} after {tally.busy} of {tally.decided} would-have "
            f"{noun} ({rate * 100:.0f} %)"
        )
    if tally.unknown:
        line += f"; {tally.unknown} left out: no telemetry for part of the {span} after"
    if tally.pending:
        line += f"; {tally.pending} too recent to tell"
    return line
