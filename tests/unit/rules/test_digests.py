"""When a scheduled digest is due: the latest period whose local send time has passed, named by
day or ISO week, across daylight-saving changes, and once only after a downtime."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import pytest

from rules.digests import Period, due_period, ready

H = timedelta(hours=1)


@dataclass(frozen=True)
class At:
    """A digest's schedule, as the `reports:` section gives it."""

    day: str
    at: time
    tz: str


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


BERLIN_MON_9 = At("mon", time(9), "Europe/Berlin")
NEW_YORK_DAILY = At("daily", time(7, 30), "America/New_York")


@pytest.mark.parametrize(
    ("schedule", "now", "expected"),
    [
        # Berlin, spring: Monday 30 March 09:00 is CEST (07:00 UTC); the week before began on
        # Monday 23 March 09:00 CET (08:00 UTC): 167 hours.
        (BERLIN_MON_9, utc(2026, 3, 30, 7), ("2026-W14", utc(2026, 3, 30, 7), utc(2026, 3, 23, 8),
         date(2026, 3, 23))),
        (BERLIN_MON_9, utc(2026, 3, 30, 6, 59), ("2026-W13", utc(2026, 3, 23, 8),
         utc(2026, 3, 16, 8), date(2026, 3, 16))),
        # Berlin, autumn: Monday 26 October 09:00 is CET (08:00 UTC); its week began at 09:00
        # CEST (07:00 UTC) on the 19th: 169 hours. At 07:30 UTC it is 08:30 there: not yet.
        (BERLIN_MON_9, utc(2026, 10, 26, 7, 30), ("2026-W43", utc(2026, 10, 19, 7),
         utc(2026, 10, 12, 7), date(2026, 10, 12))),
        (BERLIN_MON_9, utc(2026, 10, 26, 8), ("2026-W44", utc(2026, 10, 26, 8),
         utc(2026, 10, 19, 7), date(2026, 10, 19))),
        # New York, daily 07:30: 8 March is the spring change (EST 12:30 UTC the day before,
        # EDT 11:30 UTC that day: a 23-hour day); 1 November the autumn one (25 hours).
        (NEW_YORK_DAILY, utc(2026, 3, 8, 11, 30), ("2026-03-08", utc(2026, 3, 8, 11, 30),
         utc(2026, 3, 7, 12, 30), date(2026, 3, 7))),
        (NEW_YORK_DAILY, utc(2026, 3, 8, 11, 29), ("2026-03-07", utc(2026, 3, 7, 12, 30),
         utc(2026, 3, 6, 12, 30), date(2026, 3, 6))),
        (NEW_YORK_DAILY, utc(2026, 11, 1, 12, 30), ("2026-11-01", utc(2026, 11, 1, 12, 30),
         utc(2026, 10, 31, 11, 30), date(2026, 10, 31))),
        # 11:30 UTC on 1 November is 06:30 EST there: the 31 October digest is the latest.
        (NEW_YORK_DAILY, utc(2026, 11, 1, 11, 30), ("2026-10-31", utc(2026, 10, 31, 11, 30),
         utc(2026, 10, 30, 11, 30), date(2026, 10, 30))),
        # the ISO week of a Sunday in early January belongs to the year before
        (At("sun", time(18), "UTC"), utc(2027, 1, 3, 18), ("2026-W53", utc(2027, 1, 3, 18),
         utc(2026, 12, 27, 18), date(2026, 12, 27))),
        (At("mon", time(0), "UTC"), utc(2027, 1, 4), ("2027-W01", utc(2027, 1, 4),
         utc(2026, 12, 28), date(2026, 12, 28))),
    ],
)  # fmt: skip
def test_the_latest_period_and_its_window_in_local_wall_time(
    schedule: At, now: datetime, expected: tuple[str, datetime, datetime, date]
) -> None:
    """(key, send time, window start, its first local day); the window ends at the send."""
    key, send_at, since, first_day = expected
    days = 1 if schedule.day == "daily" else 7
    assert Period(key, send_at, since, send_at, first_day, days) == due_period(schedule, now, None)


@pytest.mark.parametrize(
    ("day", "sent_on", "key"),
    [
        ("mon", date(2026, 11, 30), "2026-W49"),
        ("tue", date(2026, 12, 1), "2026-W49"),
        ("wed", date(2026, 12, 2), "2026-W49"),  # today, 09:00 has passed at 12:00
        ("thu", date(2026, 11, 26), "2026-W48"),
        ("fri", date(2026, 11, 27), "2026-W48"),
        ("sat", date(2026, 11, 28), "2026-W48"),
        ("sun", date(2026, 11, 29), "2026-W48"),
    ],
)
def test_each_day_name_sends_on_that_weekday(day: str, sent_on: date, key: str) -> None:
    """Wednesday 2 December 2026, 12:00 UTC: the latest 09:00 of each weekday."""
    period = due_period(At(day, time(9), "UTC"), utc(2026, 12, 2, 12), None)
    assert period is not None
    assert (key, sent_on, sent_on - timedelta(days=7)) == (
        period.key,
        period.send_at.date(),
        period.first_day,
    )


def test_a_period_sent_is_not_due_again() -> None:
    now = utc(2026, 12, 2, 12)
    schedule = At("mon", time(9), "UTC")
    assert due_period(schedule, now, "2026-W49") is None
    assert due_period(schedule, utc(2026, 12, 7, 8, 59), "2026-W49") is None
    following = due_period(schedule, utc(2026, 12, 7, 9), "2026-W49")
    assert following is not None
    assert "2026-W50" == following.key


def test_a_downtime_over_several_send_times_sends_only_the_latest() -> None:
    """Sent for W45; back three weeks later: W48 is due, once, and nothing in between."""
    schedule = At("sun", time(18), "America/New_York")
    back = utc(2026, 11, 30, 15)  # Monday 10:00 in New York
    period = due_period(schedule, back, "2026-W45")
    assert period is not None
    assert ("2026-W48", utc(2026, 11, 29, 23)) == (period.key, period.send_at)
    assert due_period(schedule, back + H, period.key) is None


def test_a_send_time_the_clocks_skip_goes_out_an_hour_later_on_the_new_clock() -> None:
    """02:30 does not exist in Berlin on 29 March 2026: it is read as 01:30 UTC (03:30 CEST)."""
    schedule = At("daily", time(2, 30), "Europe/Berlin")
    before = due_period(schedule, utc(2026, 3, 29, 1, 29), None)
    after = due_period(schedule, utc(2026, 3, 29, 1, 30), None)
    assert before is not None
    assert after is not None
    assert ("2026-03-28", "2026-03-29") == (before.key, after.key)
    assert (utc(2026, 3, 29, 1, 30), utc(2026, 3, 28, 1, 30)) == (after.send_at, after.since)


def test_a_send_time_that_happens_twice_sends_once() -> None:
    """02:30 happens twice in Berlin on 25 October 2026: the first (00:30 UTC, CEST) sends;
    the second (01:30 UTC) finds the period sent."""
    schedule = At("daily", time(2, 30), "Europe/Berlin")
    first = due_period(schedule, utc(2026, 10, 25, 0, 30), "2026-10-24")
    assert first is not None
    assert ("2026-10-25", utc(2026, 10, 25, 0, 30)) == (first.key, first.send_at)
    assert due_period(schedule, utc(2026, 10, 25, 1, 30), first.key) is None


@pytest.mark.parametrize(
    ("now", "rolled_until", "expected"),
    [
        (utc(2026, 11, 30, 9), None, False),  # the send time; nothing rolled up yet
        (utc(2026, 11, 30, 9), utc(2026, 11, 30, 8), False),  # the last hour not rolled yet
        (utc(2026, 11, 30, 9, 5), utc(2026, 11, 30, 9), True),  # rolled to the window's end
        (utc(2026, 11, 30, 9, 5), utc(2026, 11, 30, 10), True),
        (utc(2026, 11, 30, 9, 59), utc(2026, 11, 29), False),
        (utc(2026, 11, 30, 10), utc(2026, 11, 29), True),  # an hour is long enough to wait
        (utc(2026, 11, 30, 10), None, True),
    ],
)
def test_a_due_period_waits_for_the_rollups_at_most_an_hour(
    now: datetime, rolled_until: datetime | None, expected: bool
) -> None:
    """Monday 30 November 09:00 UTC: the week before, once the rollups reach 09:00."""
    period = due_period(At("mon", time(9), "UTC"), utc(2026, 11, 30, 9), None)
    assert period is not None
    assert expected == ready(period, now, rolled_until)
