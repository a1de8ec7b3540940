"""What a rollup hour is made of: the spans leases held GPUs (`Held`), the sums of a GPU's
minutes under each (`Minutes`), and the cut at a span's ends, where a lease held only part of a
minute (granted 10:00:50, it held 10 s of 10:00) and the rest of a busy minute is unreserved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col

from storage.tables import GpuMinuteRow

HOUR = timedelta(hours=1)
MINUTE_S = 60.0


@dataclass(frozen=True)
class Held:
    """One GPU held by one lease from `start` until `end` (None: it still holds it)."""

    lease_id: int
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


@dataclass(frozen=True)
class Minutes:
    """What the minutes of one GPU in one hour under one lease (or none) add up to, in seconds
    of those minutes the lease held (all of each minute for the time no lease held)."""

    observed_s: float
    busy_s: float
    util_pct_s: float  # utilisation x seconds
    memory_peak_mib: int | None


def aware(at: datetime) -> datetime:
    # A bare aggregate loses the column's type: SQLite hands back text, PostgreSQL a datetime.
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def cut_edges(
    session: Session,
    hour: datetime,
    spans: Sequence[Held],
    minutes: dict[tuple[str, int, int], Minutes],
    *,
    busy_pct: float,
) -> defaultdict[tuple[str, int], float]:
    """Take off each lease's sums the part of the minutes at its interval's ends that it did
    not hold (granted 10:00:50, it held 10 s of 10:00); returns each GPU's busy seconds in those
    minutes that no lease held."""
    edges: defaultdict[tuple[str, int, datetime], list[Held]] = defaultdict(list)
    for span in spans:
        for at in {_floor_minute(span.start), _floor_minute(span.end or span.start)}:
            if hour <= at < hour + HOUR and 0 < _held_s(span, at) < MINUTE_S:
                edges[span.node, span.index, at].append(span)
    free: defaultdict[tuple[str, int], float] = defaultdict(float)
    for (node, index, at), (ok, util) in _edge_minutes(session, list(edges)).items():
        pct = util if ok > 0 and util is not None else None  # None: no working reading
        worked = pct is not None and pct >= busy_pct
        covered = 0.0
        for span in edges[node, index, at]:
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


def _floor_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _held_s(span: Held, minute: datetime) -> float:
    """The seconds of the minute starting at `minute` that `span` held."""
    until = minute + timedelta(seconds=MINUTE_S)
    end = until if span.end is None else min(span.end, until)
    return max(0.0, (end - max(span.start, minute)).total_seconds())


#: Minutes read per statement (three bound values each, under SQLite's limit).
_EDGES_AT_ONCE = 5_000


def _edge_minutes(
    session: Session, keys: Sequence[tuple[str, int, datetime]]
) -> dict[tuple[str, int, datetime], tuple[int, float | None]]:
    """The stored minutes at these (node, index, minute): ok readings and utilisation."""
    m = GpuMinuteRow
    out: dict[tuple[str, int, datetime], tuple[int, float | None]] = {}
    for first in range(0, len(keys), _EDGES_AT_ONCE):
        chunk = keys[first : first + _EDGES_AT_ONCE]
        stmt = sa.select(
            col(m.node), col(m.index), col(m.minute), col(m.ok_samples), col(m.util_avg_pct)
        ).where(
            # The range first: SQLite reads those minutes from the minute index; a list of
            # row values alone would have it scan every stored minute.
            col(m.minute) >= min(at for _, _, at in chunk),
            col(m.minute) <= max(at for _, _, at in chunk),
            sa.tuple_(col(m.node), col(m.index), col(m.minute)).in_(chunk),
        )
        for node, index, minute, ok, util in session.connection().execute(stmt).all():
            out[node, index, aware(minute)] = (int(ok), None if util is None else float(util))
    return out
