"""When a request waiting for a person is reminded about, escalated, or expires.

With working hours in the settings every clock counts only working time (it stops outside them),
expiry's too: a request filed on Friday evening is not withdrawn over the weekend before anyone
could see it. Pure: `now` and the stored facts are passed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo

from rules.policy import Approvals, WorkingHours

_MAX_DAYS = 400  # a working week with no working day at all is refused by the schema


class StepKind(StrEnum):
    REMIND = "remind"
    ESCALATE = "escalate"
    EXPIRE = "expire"
    NOTHING = "nothing"


@dataclass(frozen=True)
class Waiting:
    """What is stored about one request waiting for a person."""

    filed_at: datetime
    reminders: int = 0
    reminded_at: datetime | None = None
    escalated: bool = False


@dataclass(frozen=True)
class Step:
    """The next step for a waiting request, and when it is due (None: never)."""

    kind: StepKind
    at: datetime | None = None

    def due(self, now: datetime) -> bool:
        return self.at is not None and self.at <= now


_FIRST = {StepKind.EXPIRE: 0, StepKind.ESCALATE: 1, StepKind.REMIND: 2}


def next_step(
    waiting: Waiting, now: datetime, settings: Approvals, *, deadline: datetime | None = None
) -> Step:
    """The step due now (expiry before escalation before a reminder), else the next to come.
    `deadline`: past it the answer comes too late (an extension's lease is about to end), so
    the request is escalated then if it was not yet, working hours or not."""
    hours = settings.working_hours
    steps = [Step(StepKind.EXPIRE, working_add(waiting.filed_at, settings.expire_after, hours))]
    if not waiting.escalated and settings.escalate_after is not None:
        at = working_add(waiting.filed_at, settings.escalate_after, hours)
        steps.append(Step(StepKind.ESCALATE, min(at, deadline) if deadline else at))
    if waiting.reminders < settings.max_reminders:
        if waiting.reminders == 0 or waiting.reminded_at is None:
            at = working_add(waiting.filed_at, settings.remind_after, hours)
        else:
            at = working_add(waiting.reminded_at, settings.remind_every, hours)
        steps.append(Step(StepKind.REMIND, at))
    due = [s for s in steps if s.due(now)]
    if due:
        return min(due, key=lambda s: _FIRST[s.kind])
    return min(steps, key=lambda s: (s.at or now, _FIRST[s.kind]))


def working_add(start: datetime, amount: timedelta, hours: WorkingHours | None) -> datetime:
    """The moment `amount` of working time has passed since `start` (wall time without hours)."""
    if hours is None:
        return start + amount
    left = amount
    for opens, closes in _windows(start, hours):
        begin = max(opens, start)
        if begin >= closes:
            continue
        if begin + left <= closes:
            return begin + left
        left -= closes - begin
    return start + amount + timedelta(days=_MAX_DAYS)  # unreachable with a valid week


def working_between(start: datetime, end: datetime, hours: WorkingHours | None) -> timedelta:
    """How much working time lies between `start` and `end` (wall time without hours)."""
    if hours is None or end <= start:
        return max(end - start, timedelta(0))
    total = timedelta(0)
    for opens, closes in _windows(start, hours):
        if opens >= end:
            break
        total += max(min(closes, end) - max(opens, start), timedelta(0))
    return total


def in_hours(at: datetime, hours: WorkingHours | None) -> bool:
    """Is `at` within working hours (always, without hours)?"""
    if hours is None:
        return True
    for opens, closes in _windows(at - timedelta(days=1), hours):
        if opens > at:
            return False
        if at < closes:
            return True
    return False


def _windows(start: datetime, hours: WorkingHours) -> Iterator[tuple[datetime, datetime]]:
    """The working windows (aware UTC) of the local days from the day of `start` on."""
    zone = ZoneInfo(hours.tz)
    day = start.astimezone(zone).date()
    for n in range(_MAX_DAYS):
        date = day + timedelta(days=n)
        if date.weekday() in hours.days:
            # Local wall times: across a DST change the window is an hour longer or shorter.
            opens = datetime.combine(date, hours.start, tzinfo=zone).astimezone(UTC)
            closes = datetime.combine(date, hours.end, tzinfo=zone).astimezone(UTC)
            yield opens, closes


def tell_at(filed_at: datetime, ends_at: datetime, leads: tuple[timedelta, ...]) -> datetime | None:
    """When the holder of a lease ending at `ends_at` hears that an extension filed at
    `filed_at` still waits: at the first expiry warning after it was filed (None: it was filed
    after the last one, and the answer to the request said so already)."""
    after = [ends_at - lead for lead in leads if ends_at - lead > filed_at]
    return min(after) if after else None
