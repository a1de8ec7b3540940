"""When a scheduled digest is due: its periods, their send times in local wall time, and the
window each one covers.

A digest is sent `daily` or on one weekday, at a wall-clock time in its time zone, and covers
the day (or the 7 days) before its send time, counted in that zone's wall time, so a week across
a daylight-saving change is 167 or 169 hours long. A period is named by the local date of its
send time ("2026-12-02") or, weekly, by that date's ISO week ("2026-W49"). Only the latest
period whose send time has passed is ever due: a bot that was down over several send times
sends one digest when it is back, not one per missed period. A period due waits for the hourly
rollups to cover its window, at most `ROLLUP_WAIT` after its send time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

DAILY = "daily"
#: How long a digest due waits for the hourly rollups to reach the end of its window.
ROLLUP_WAIT = timedelta(hours=1)
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Schedule(Protocol):
    """What a digest's schedule says (rules.policy.Digest has these)."""

    @property
    def day(self) -> str: ...  # "daily", or "mon" .. "sun"

    @property
    def at(self) -> time: ...  # local wall time

    @property
    def tz(self) -> str: ...  # an IANA zone name


@dataclass(frozen=True)
class Period:
    """One sending of a digest: its name, when it goes out, and the window it covers
    ([since, until), aware UTC; `until` is the send time). `first_day`: the local date the
    window starts on (the "week of ..." a weekly digest names)."""

    key: str
    send_at: datetime
    since: datetime
    until: datetime
    first_day: date
    days: int


def due_period(schedule: Schedule, now: datetime, last_sent: str | None) -> Period | None:
    """The latest period of `schedule` whose send time is at or before `now`, unless it is
    `last_sent` (the key of the period sent last); None when nothing is due."""
    period = latest_period(schedule, now)
    return None if period.key == last_sent else period


def ready(period: Period, now: datetime, rolled_until: datetime | None) -> bool:
    """Whether a due `period` can go out now: the hourly rollups reach the end of its window
    (`rolled_until`: the end of the latest hour they hold), or it has waited `ROLLUP_WAIT`."""
    caught_up = rolled_until is not None and rolled_until >= period.until
    return caught_up or now >= period.send_at + ROLLUP_WAIT


def latest_period(schedule: Schedule, now: datetime) -> Period:
    """The latest period of `schedule` whose send time is at or before `now`."""
    zone = ZoneInfo(schedule.tz)
    today = now.astimezone(zone).date()
    step = 1 if schedule.day == DAILY else 7
    back = 0 if schedule.day == DAILY else (today.weekday() - WEEKDAYS.index(schedule.day)) % 7
    day = today - timedelta(days=back)
    if _local(day, schedule.at, zone) > now:
        day -= timedelta(days=step)
    return _period(day, schedule.at, zone, step)


def _period(day: date, at: time, zone: ZoneInfo, days: int) -> Period:
    send = datetime.combine(day, at, tzinfo=zone)
    # Aware arithmetic in one zone is wall-clock arithmetic: the same local time `days` before.
    start = send - timedelta(days=days)
    if days == 1:
        key = day.isoformat()
    else:
        year, week, _ = day.isocalendar()
        key = f"{year}-W{week:02d}"
    return Period(
        key=key,
        send_at=send.astimezone(UTC),
        since=start.astimezone(UTC),
        until=send.astimezone(UTC),
        first_day=start.date(),
        days=days,
    )


def _local(day: date, at: time, zone: ZoneInfo) -> datetime:
    """`at` on `day` in `zone`, as an aware UTC time. A wall time the clocks skip (02:30 on
    the spring change) is read with the offset before the change, i.e. an hour later on the
    new clock; one that happens twice (the autumn change) is its first occurrence."""
    return datetime.combine(day, at, tzinfo=zone).astimezone(UTC)
