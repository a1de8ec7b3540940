"""What a rollup hour is made of: the spans leases held GPUs (`Held`), the sums of a GPU's
minutes under each (`Minutes`), and the cut at a span's ends, where a lease held only part of a
minute (granted 10:00:50, it held 10 s of 10:00) and the rest of a busy minute is unreserved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
MINUTE_S = 60.0
#: One stored minute's ok readings and average utilisation (None: no working reading).
Reading = tuple[int, float | None]


@dataclass(frozen=True)
class Held:
    """One GPU held by one lease from `start` until `end` (None: it still holds it)."""

    lease_id: int
    gpu_id: int
    node: str
    index: int
    pool: str
    team: str
    holder: str
    start: datetime
    end: datetime | None

    def seconds_in(self, hour: datetime) -> float:
        """How long it held the GPU in [hour, hour + 1 h)."""
        until = hour + HOUR if self.end is None else min(self.end, hour + HOUR)
        return max(0.0, (until - max(self.start, hour)).total_seconds())

    def holds_all(self, hour: datetime) -> bool:
        """Whether it held the GPU through the whole of [hour, hour + 1 h)."""
        return self.start <= hour and (self.end is None or self.end >= hour + HOUR)

    def holds_minute(self, minute: datetime) -> bool:
        """Whether it held any of the minute starting at `minute`: the minute counts for it
        whole, and `cut_edges` takes off what it did not hold."""
        return floor_minute(self.start) <= minute and (self.end is None or minute < self.end)


@dataclass(frozen=True)
class Minutes:
    """What the minutes of one GPU in one hour under one lease (or none) add up to, in seconds
    of those minutes the lease held (all of each minute for the time no lease held)."""

    observed_s: float
    busy_s: float
    util_pct_s: float  # utilisation x seconds
    memory_peak_mib: int | None


def aware(at: datetime | str) -> datetime:
    # A bare aggregate loses the column's type: SQLite hands back text, PostgreSQL a datetime.
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def cut_edges(
    hour: datetime,
    spans: Sequence[Held],
    minutes: dict[tuple[str, int, int], Minutes],
    readings: dict[tuple[str, int, datetime], Reading],
    *,
    busy_pct: float,
) -> defaultdict[tuple[str, int], float]:
    """Take off each lease's sums the part of the minutes at its interval's ends that it did
    not hold (granted 10:00:50, it held 10 s of 10:00); returns each GPU's busy seconds in those
    minutes that no lease held. `readings`: the stored minutes at those ends (one missing
    there was never stored)."""
    edges: defaultdict[tuple[str, int, datetime], list[Held]] = defaultdict(list)
    for span in spans:
        for at in {floor_minute(span.start), floor_minute(span.end or span.start)}:
            if hour <= at < hour + HOUR and 0 < _held_s(span, at) < MINUTE_S:
                edges[span.node, span.index, at].append(span)
    free: defaultdict[tuple[str, int], float] = defaultdict(float)
    for (node, index, at), held in edges.items():
        reading = readings.get((node, index, at))
        if reading is None:  # never stored: nothing to take off, nothing unreserved
            continue
        ok, util = reading
        pct = util if ok > 0 and util is not None else None  # None: no working reading
        worked = pct is not None and pct >= busy_pct
        covered = 0.0
        for span in held:
            held_s = _held_s(span, at)
            covered += held_s
            key = (node, index, span.lease_id)
            had = minutes.get(key)
            if had is not None and pct is not None:
                cut = MINUTE_S - held_s
                minutes[key] = Minutes(
                    had.observed_s - cut,
                    had.busy_s - cut * worked,
                    had.util_pct_s - pct * cut,
                    had.memory_peak_mib,
                )
        if worked and covered < MINUTE_S:
            free[node, index] += MINUTE_S - covered
    return free


def floor_minute(at: datetime) -> datetime:
    """The start of the minute `at` falls in."""
    return at.replace(second=0, microsecond=0)


def _held_s(span: Held, minute: datetime) -> float:
    """The seconds of the minute starting at `minute` that `span` held."""
    until = minute + MINUTE
    end = until if span.end is None else min(span.end, until)
    return max(0.0, (end - max(span.start, minute)).total_seconds())
