"""Usage reports, pure: what a window of hourly rows adds up to, and how windows are read.

GPU-hours come from the hourly rollups (storage.tables.GpuHourRow): allocated time is exact
from lease intervals; used time is weighted by utilisation; unknown time (no working reading)
is its own figure and never counted as idle. Efficiency is used / allocated.
"""

from __future__ import annotations

import calendar
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from enum import StrEnum
from typing import Literal

GroupBy = Literal["team", "holder", "pool", "lease", "day", "hour"]
HOUR = 3600.0
DEFAULT_WINDOW = "7d"


@dataclass(frozen=True)
class Usage:
    """Seconds of GPU time in a window, and what the allocated part cost."""

    allocated_s: float = 0.0
    used_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    unknown_s: float = 0.0
    unreserved_s: float = 0.0
    cost: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.allocated_s + other.allocated_s,
            self.used_s + other.used_s,
            self.busy_s + other.busy_s,
            self.idle_s + other.idle_s,
            self.unknown_s + other.unknown_s,
            self.unreserved_s + other.unreserved_s,
            self.cost + other.cost,
        )

    @property
    def allocated_h(self) -> float:
        return self.allocated_s / HOUR

    @property
    def used_h(self) -> float:
        return self.used_s / HOUR

    @property
    def idle_h(self) -> float:
        return self.idle_s / HOUR

    @property
    def unknown_h(self) -> float:
        return self.unknown_s / HOUR

    @property
    def unreserved_h(self) -> float:
        return self.unreserved_s / HOUR

    @property
    def efficiency(self) -> float | None:
        """Used over allocated GPU time; None when nothing was allocated."""
        return self.used_s / self.allocated_s if self.allocated_s > 0 else None

    @property
    def empty(self) -> bool:
        return self.allocated_s <= 0 and self.unreserved_s <= 0


def total(usages: Sequence[Usage]) -> Usage:
    out = Usage()
    for usage in usages:
        out = out + usage
    return out


class WindowError(ValueError):
    """A report window that cannot be read; the message says what would work."""


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime
    label: str  # "last 7 days", "November 2026"


# "7d", and forgiving spellings of it ("7 days", "7days", "48hrs", "2 weeks").
_SPAN = re.compile(r"(\d+)\s*(h|hrs?|hours?|d|days?|w|wks?|weeks?)")
_MONTH = re.compile(r"(\d{4})-(\d{2})")
_UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}
_LONGEST = timedelta(days=400)
#: The first year a month window may name (the years before are no one's GPU history).
FIRST_YEAR = 2000


def parse_window(text: str, now: datetime, tz: tzinfo) -> Window:
    """`7d`, `30d`, `24h`, `2w` (back from now; `7 days`, `48hrs` too), or `YYYY-MM` (that month
    in `tz`, from 2000-01 to the current month); "" is 7d."""
    raw = text.strip().lower() or DEFAULT_WINDOW
    if m := _SPAN.fullmatch(raw):
        digits, unit = m.group(1).lstrip("0") or "0", m.group(2)[0]
        # The count is bounded before it is read or multiplies: int() refuses thousands of
        # digits, and a long run of them would overflow.
        count = int(digits) if len(digits) <= 6 else _LONGEST // _UNITS[unit] + 1
        if not 1 <= count <= _LONGEST // _UNITS[unit]:
            raise WindowError(f"`{text.strip()}` is outside what reports cover (1h to 400d).")
        return Window(now - count * _UNITS[unit], now, _span_label(count, unit))
    if m := _MONTH.fullmatch(raw):
        year, month = int(m.group(1)), int(m.group(2))
        if not 1 <= month <= 12:
            raise WindowError(f"`{text.strip()}` is not a month; write it like 2026-11.")
        local = now.astimezone(tz)
        if (year, month) > (local.year, local.month):
            raise WindowError(f"{_month_name(year, month)} has not begun yet.")
        if year < FIRST_YEAR:
            raise WindowError(
                f"`{text.strip()}` is before what reports cover; "
                f"write a month from {FIRST_YEAR}-01 to {local:%Y-%m}."
            )
        start = datetime(year, month, 1, tzinfo=tz)
        end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=tz)
        return Window(start, min(end, now), f"{start:%B %Y}")
    raise WindowError(
        f"I could not read `{text.strip()}` as a time window; "
        "use 7d, 30d, 24h or a month like 2026-11."
    )


def normal_window(text: str) -> str:
    """A span as reports write it (`7 days`, `007d` -> `7d`); anything else as it was."""
    raw = text.strip().lower()
    if m := _SPAN.fullmatch(raw):
        return f"{m.group(1).lstrip('0') or '0'}{m.group(2)[0]}"
    return raw


def _month_name(year: int, month: int) -> str:
    return f"{calendar.month_name[month]} {year}"


def _span_label(count: int, unit: str) -> str:
    word = {"h": "hour", "d": "day", "w": "week"}[unit]
    return f"last {word}" if count == 1 else f"last {count} {word}s"


class ScopeKind(StrEnum):
    ME = "me"
    USER = "user"
    TEAM = "team"
    POOL = "pool"
    LAB = "lab"


@dataclass(frozen=True)
class Scope:
    """Whose use a report covers: a person (ME or USER: `name` is their Slack id), a team, a
    pool, or the whole lab."""

    kind: ScopeKind
    name: str = ""


@dataclass(frozen=True)
class Counts:
    reclaims: int = 0
    extensions: int = 0
    recalls: int = 0


@dataclass(frozen=True)
class Line:
    """One row of a breakdown: a team, person (Slack id), pool, lease ("L12"), day
    ("YYYY-MM-DD") or hour (ISO), and its use."""

    key: str
    usage: Usage


@dataclass(frozen=True)
class Figures:
    usage: Usage
    wait_p50_s: float | None = None  # request filed -> lease granted
    wait_p90_s: float | None = None
    granted: int = 0  # the requests those waits are over
    counts: Counts = field(default_factory=Counts)
    still_waiting: int = 0  # requests filed in the window with no lease yet (not in the waits)
    oldest_wait_s: float | None = None  # how long the oldest of those has waited so far


@dataclass(frozen=True)
class Report:
    scope: Scope
    window: Window
    figures: Figures
    lines: tuple[Line, ...] = ()  # the breakdown, biggest allocation first
    by: GroupBy | None = None  # what `lines` are grouped by
    days: tuple[Line, ...] = ()  # per day in the viewer's time zone, oldest first
    currency: str = "USD"
    priced: bool = False  # some pool in the report has a price
    # Where the figures end when the rollup has not rolled the whole window yet: the first
    # hour not in them (None: they cover the window).
    through: datetime | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def biggest_first(lines: dict[str, Usage]) -> tuple[Line, ...]:
    """Breakdown lines, most allocated first (then most unreserved, then by key)."""
    ordered = sorted(lines.items(), key=lambda kv: (-kv[1].allocated_s, -kv[1].unreserved_s, kv[0]))
    return tuple(Line(key, usage) for key, usage in ordered)


def day_keys(since: datetime, until: datetime, tz: tzinfo) -> list[str]:
    """Every local date from `since` to `until` (exclusive end), as YYYY-MM-DD."""
    first, last = since.astimezone(tz).date(), (until - timedelta(microseconds=1)).astimezone(tz)
    days, day = [], first
    while day <= last.date():
        days.append(day.isoformat())
        day += timedelta(days=1)
    return days
