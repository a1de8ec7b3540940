"""Report arithmetic and windows, by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from rules.reports import (
    Usage,
    WindowError,
    day_keys,
    normal_window,
    parse_window,
    percentile,
    total,
)

NOW = datetime(2026, 12, 2, 10, 30, tzinfo=UTC)
TOKYO = ZoneInfo("Asia/Tokyo")
BERLIN = ZoneInfo("Europe/Berlin")


def test_two_gpus_for_three_hours_at_half_utilisation() -> None:
    hour = Usage(allocated_s=3600, used_s=1800, busy_s=3600)
    usage = total([hour] * 6)
    assert (6.0, 3.0, 0.5) == (usage.allocated_h, usage.used_h, usage.efficiency)


def test_nothing_allocated_has_no_efficiency() -> None:
    assert Usage(unreserved_s=60).efficiency is None
    assert Usage().empty
    assert not Usage(unreserved_s=60).empty


@pytest.mark.parametrize(
    ("text", "since", "label"),
    [
        ("", NOW - timedelta(days=7), "last 7 days"),
        ("30d", NOW - timedelta(days=30), "last 30 days"),
        ("24h", NOW - timedelta(hours=24), "last 24 hours"),
        ("1w", NOW - timedelta(weeks=1), "last week"),
        ("30days", NOW - timedelta(days=30), "last 30 days"),
        ("2 weeks", NOW - timedelta(weeks=2), "last 2 weeks"),
        ("48hrs", NOW - timedelta(hours=48), "last 48 hours"),
        ("400d", NOW - timedelta(days=400), "last 400 days"),
    ],
)
def test_spans_count_back_from_now(text: str, since: datetime, label: str) -> None:
    window = parse_window(text, NOW, UTC)
    assert (since, NOW, label) == (window.since, window.until, window.label)


def test_a_month_is_its_local_days_and_ends_now_while_it_runs() -> None:
    november = parse_window("2026-11", NOW, BERLIN)
    assert november.since == datetime(2026, 10, 31, 23, 0, tzinfo=UTC)
    assert november.until == datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    assert "November 2026" == november.label
    assert NOW == parse_window("2026-12", NOW, UTC).until


@pytest.mark.parametrize(
    ("text", "says"),
    [("soon", "could not read `soon`"), ("2026-13", "not a month"), ("500d", "1h to 400d"),
     ("9601h", "1h to 400d"), ("58w", "1h to 400d"), ("0h", "1h to 400d"),
     ("99999999999999999999d", "1h to 400d"), ("9" * 5000 + "d", "1h to 400d"),
     ("2027-01", "^January 2027 has not begun yet.$"),
     ("9999-12", "^December 9999 has not begun yet.$"),
     ("0000-05", "^`0000-05` is before what reports cover; write a month from 2000-01 to "
                 "2026-12.$"),
     ("0001-01", "before what reports cover"), ("1999-12", "before what reports cover")],
)  # fmt: skip
def test_windows_that_cannot_be_read_say_what_would_work(text: str, says: str) -> None:
    with pytest.raises(WindowError, match=says):
        parse_window(text, NOW, UTC)


def test_months_from_2000_to_this_month_are_read_in_the_zone() -> None:
    """The first month reports cover, and the current one: at 20:00 UTC on November 30 it is
    already December in Tokyo."""
    first = parse_window("2000-01", NOW, TOKYO)
    assert (datetime(2000, 1, 1, tzinfo=TOKYO), "January 2000") == (first.since, first.label)
    evening = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
    december = parse_window("2026-12", evening, TOKYO)
    assert (datetime(2026, 12, 1, tzinfo=TOKYO), evening) == (december.since, december.until)


def test_percentiles_interpolate() -> None:
    assert percentile([], 50) is None
    assert 30.0 == percentile([10, 50, 30], 50)
    assert 46.0 == percentile([10, 30, 50], 90)


def test_day_keys_follow_the_local_calendar() -> None:
    since = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)  # 23:00 in Berlin
    assert ["2026-11-30", "2026-12-01"] == day_keys(since, since + timedelta(hours=2), BERLIN)


@pytest.mark.parametrize(
    ("typed", "written"),
    [("7 days", "7d"), ("007D", "7d"), ("48hrs", "48h"), ("2 Weeks", "2w"), ("2026-11", "2026-11"),
     ("", "")],
)  # fmt: skip
def test_a_span_is_written_as_reports_write_it(typed: str, written: str) -> None:
    assert written == normal_window(typed)
