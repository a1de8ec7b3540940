"""The free words of `borrow` and `extend`: counts, pools, durations, end times and priorities.

Order-independent and case-insensitive; end times are read in the person's zone, kept in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from rules.domain import Priority, format_duration, plural
from rules.expr import parse_duration

MAX_LENGTH = timedelta(days=366)  # beyond this a number is a typo, not a plan
DEFAULT_CLOCK = time(9)  # `until monday` means Monday morning
_UNITS = {
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 1),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 60),
    **dict.fromkeys(("d", "day", "days"), 24 * 60),
    **dict.fromkeys(("w", "wk", "week", "weeks"), 7 * 24 * 60),
}
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8}
_NUMBERS |= {"seven": 7, "nine": 9, "ten": 10}
_FILLER = frozenset({"gpu", "gpus", "a", "an", "x", "please", "pls", "on", "from", "of", "the"})
_FILLER |= {"pool", "in", "me", "lease"}
_LEVELS = {"low": Priority.LOW, "normal": Priority.NORMAL, "medium": Priority.NORMAL}
_LEVELS |= {"high": Priority.HIGH, "urgent": Priority.HIGH}
_PRIORITY = ("priority", "prio", "priority:", "prio:")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_LABELS = {"count": "count", "pool": "pool", "duration": "duration", "until": "end time"}
_LABELS |= {"priority": "priority", "lease": "lease"}
_NUM = re.compile(r"\d{1,4}", re.ASCII)
_DECIMAL = re.compile(r"\d{1,6}(?:\.\d{1,3})?", re.ASCII)
_COUNT = re.compile(r"x(\d{1,4})|(\d{1,4})x", re.ASCII)
_COUNT_POOL = re.compile(r"(\d{1,4})x?([a-z].*)", re.ASCII)
_UNIT_WORD = re.compile(r"(\d{1,6}(?:\.\d{1,3})?)([a-z]+)", re.ASCII)
_CLOCK = re.compile(r"(\d{1,2})(?::(\d{2}))?(am|pm)?", re.ASCII)
_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_PRIO_ONE = re.compile(r"(?:priority|prio)[:=]([a-z]+)", re.ASCII)
_LEASE = re.compile(r"[l#]?(\d{1,9})", re.ASCII)


def clip(text: str, limit: int) -> str:
    """At most `limit` characters, with an ellipsis when cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)].rstrip() + "…"


def quote(text: str, limit: int = 80) -> str:
    """A person's words as a code span: whitespace folded, backticks neutralised, long text cut."""
    return "`" + clip(" ".join(text.split()), limit).replace("`", "'") + "`"


@dataclass
class Words:
    """What the words said; `trouble` names what they did not."""

    count: int | None = None
    pool: str | None = None
    duration: timedelta | None = None
    until: datetime | None = None  # aware UTC
    priority: Priority | None = None
    lease: int | None = None
    until_text: str = ""  # the end time as read, so the person can check it
    unknown: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def trouble(self) -> str:
        """One or two sentences about what could not be read; empty when all of it was."""
        out = list(self.problems[:3])
        if self.unknown:
            out.append(f"I did not understand {', '.join(quote(u) for u in self.unknown[:5])}.")
        return " ".join(out)

    def length(self, now: datetime) -> timedelta | None:
        return self.until - now if self.until is not None else self.duration

    def understood(self) -> list[str]:
        out = [f"lease L{self.lease}"] if self.lease is not None else []
        if self.count is not None:
            out.append(plural(self.count, "GPU"))
        if self.pool:
            out.append(f"pool {self.pool}")
        if self.duration is not None:
            out.append(f"for {format_duration(self.duration)}")
        if self.until_text:
            out.append(self.until_text)
        if self.priority is not None:
            out.append(f"priority {self.priority}")
        return out

    def put(self, slot: str, value: object, word: str) -> None:
        old = getattr(self, slot)
        if old is not None and old != value:
            self.problems.append(f"{quote(word)} contradicts the {_LABELS[slot]} given before.")
        else:
            setattr(self, slot, value)


def read_words(
    text: str, *, now: datetime, tz: ZoneInfo, pools: Collection[str], leases: bool
) -> Words:
    """Read every word; `leases` reads numbers as lease ids (extend) rather than counts."""
    words = text.replace(",", " ").split()
    reader = _Reader([w.lower().strip(".;!?()") for w in words], now, tz, pools, leases)
    found, i, last_unknown = reader.found, 0, -2
    while i < len(words):
        if used := reader.one(i):
            i += used
            continue
        if last_unknown == i - 1:
            found.unknown[-1] += " " + words[i]
        else:
            found.unknown.append(words[i])
        last_unknown, i = i, i + 1
    if found.duration is not None and found.until is not None:
        found.problems.append("Give a duration or an end time, not both.")
    return found


class _Reader:
    def __init__(
        self, toks: list[str], now: datetime, tz: ZoneInfo, pools: Collection[str], leases: bool
    ) -> None:
        self.toks, self.now, self.tz, self.leases = toks, now, tz, leases
        self.names = {p.lower(): p for p in pools}
        self.found = Words()

    def at(self, i: int) -> str:
        return self.toks[i] if i < len(self.toks) else ""

    def one(self, i: int) -> int:
        """Read the word at `i` and what belongs to it; how many words that took (0: none)."""
        t = self.toks[i]
        if t in ("for", "by"):
            return self._for(i)
        if got := _duration(self.toks, i):
            return _take_duration(self.found, got[0], " ".join(self.toks[i : i + got[1]]), got[1])
        if t == "until":
            return 1 + self.until(i + 1)
        if (used := self._priority(t, self.at(i + 1))) is not None:
            return used
        return self._lease(t) if self.leases else self._what(t)

    def _for(self, i: int) -> int:
        """`for 6h`, `by 2 hours`; `for 6` is a problem: no unit."""
        w, t, nxt = self.found, self.toks[i], self.at(i + 1)
        if got := _duration(self.toks, i + 1):
            return 1 + _take_duration(w, got[0], " ".join(self.toks[i : i + 1 + got[1]]), got[1])
        if _DECIMAL.fullmatch(nxt):
            w.problems.append(f"{quote(t + ' ' + nxt)} needs a unit, e.g. `{t} {nxt}h`.")
            return 2
        return 0

    def _priority(self, t: str, nxt: str) -> int | None:
        """`priority:high`, `priority high`, `high priority`, `urgent`; None: not a priority."""
        w = self.found
        if (m := _PRIO_ONE.fullmatch(t)) and m[1] in _LEVELS:
            w.put("priority", _LEVELS[m[1]], t)
            return 1
        if t in _PRIORITY and nxt in _LEVELS:
            w.put("priority", _LEVELS[nxt], f"{t} {nxt}")
            return 2
        if t in _LEVELS and nxt in _PRIORITY:
            w.put("priority", _LEVELS[t], f"{t} {nxt}")
            return 2
        if t in ("urgent", "asap"):
            w.put("priority", Priority.HIGH, t)
            return 1
        return None

    def _lease(self, t: str) -> int:
        """A lease id (extend): `L7`, `#7`, `7`."""
        if m := _LEASE.fullmatch(t):
            self.found.put("lease", int(m[1]), t)
            return 1
        return 1 if t in _FILLER or t == "+" else 0

    def _what(self, t: str) -> int:
        """A pool, a count, or both in one word (`2xa100`)."""
        w = self.found
        if pool := _pool(t, self.names):
            w.put("pool", pool, t)
            return 1
        if (count := _count(t)) is not None:
            _take_count(w, count, t)
            return 1
        if (m := _COUNT_POOL.fullmatch(t)) and (pool := _pool(m[2], self.names)):
            _take_count(w, int(m[1]), t)
            w.put("pool", pool, t)
            return 1
        return 1 if t in _FILLER else 0

    def until(self, j: int) -> int:
        """Read `fri 18:00`, `tomorrow 9am`, `2026-03-05 12:00`, `18:00`, `monday`; words used."""
        w, now, tz = self.found, self.now, self.tz
        today = now.astimezone(tz).date()
        day: date | int | None = None  # a date, or a weekday number
        clock: time | None = None
        k = j
        while k < len(self.toks):
            if day is None and (d := _day(self.toks[k], today)) is not None:
                day = d
            elif clock is None and (c := _clock(self.toks[k], self.at(k + 1))) is not None:
                clock, k = c[0], k + c[1]
            elif self.toks[k] != "at" or day is None or clock is not None:
                break
            k += 1
        words = " ".join(["until", *self.toks[j:k]])
        if day is None and clock is None:
            w.problems.append("`until` needs a day or a time, e.g. `until fri 18:00`.")
            return k - j
        if isinstance(day, date):
            days = [day]
        elif day is not None:
            days = [
                today + timedelta(n) for n in range(8) if (today + timedelta(n)).weekday() == day
            ]
        else:
            days = [today, today + timedelta(1)]
        ends = [
            datetime.combine(d, clock or DEFAULT_CLOCK, tzinfo=tz).astimezone(UTC) for d in days
        ]
        end = next((e for e in ends if e > now), ends[-1])
        local = end.astimezone(tz)
        if end <= now:
            w.problems.append(f"{quote(words)} is already past ({local:%a %Y-%m-%d %H:%M}).")
        elif end - now > MAX_LENGTH:
            w.problems.append(f"{quote(words)} is more than a year away.")
        else:
            w.until_text = f"until {local:%a %Y-%m-%d %H:%M} ({tz.key})"
            w.put("until", end, words)
        return k - j


def _pool(t: str, names: dict[str, str]) -> str | None:
    return names.get(t) or (names.get(t[:-1]) if t.endswith("s") else None)


def _count(t: str) -> int | None:
    if _NUM.fullmatch(t):
        return int(t)
    if m := _COUNT.fullmatch(t):
        return int(m[1] or m[2])
    return _NUMBERS.get(t)


def _take_count(w: Words, count: int, word: str) -> None:
    if count < 1:
        w.problems.append("Ask for at least one GPU.")
    else:
        w.put("count", count, word)


def _duration(toks: list[str], i: int) -> tuple[float, int] | None:
    """Minutes and words used by a duration at `i`: 6h, 1h30m, 90min, +2h, 2 hours."""
    t = toks[i].removeprefix("+") if i < len(toks) else ""
    if not t:
        return None
    if (minutes := parse_duration(t)) is not None:
        return minutes, 1
    if (m := _UNIT_WORD.fullmatch(t)) and m[2] in _UNITS:
        return float(m[1]) * _UNITS[m[2]], 1
    if _DECIMAL.fullmatch(t) and i + 1 < len(toks) and toks[i + 1] in _UNITS:
        return float(t) * _UNITS[toks[i + 1]], 2
    return None


def _take_duration(w: Words, minutes: float, words: str, used: int) -> int:
    if minutes * 60 < 1:
        w.problems.append(f"{quote(words)} is no time at all; say e.g. `for 6h`.")
    elif minutes > MAX_LENGTH.total_seconds() / 60:
        w.problems.append(f"{quote(words)} is more than a year; say e.g. `for 2d`.")
    else:
        w.put("duration", timedelta(minutes=minutes), words)
    return used


def _day(t: str, today: date) -> date | int | None:
    if t == "today":
        return today
    if t in ("tomorrow", "tmrw", "tmr"):
        return today + timedelta(1)
    for number, name in enumerate(_WEEKDAYS):
        if len(t) >= 3 and name.startswith(t):
            return number
    if _ISO_DAY.fullmatch(t):
        try:
            day = date.fromisoformat(t)
        except ValueError:
            return None
        return day if abs(day.year - today.year) <= 5 else None
    return None


def _clock(t: str, nxt: str) -> tuple[time, int] | None:
    """A time of day and the extra words it used: 18:00, 6pm, 6:30 pm, 9am, noon, midnight."""
    if t in ("noon", "midnight"):
        return time(12 if t == "noon" else 0), 0
    m = _CLOCK.fullmatch(t)
    if m is None:
        return None
    hour, minute, half, extra = int(m[1]), int(m[2] or 0), m[3], 0
    if half is None and nxt in ("am", "pm"):
        half, extra = nxt, 1
    if half is None and m[2] is None:
        return None  # a bare number is a count, not a time
    if half is not None:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    return time(hour, minute), extra
