"""The hourly rollup (the `rollup` job): every whole hour not rolled yet goes into gpu_hour, and
the two hours rolled last go again (an agent's push may arrive late), never the current hour;
then the hourly rows older than the rules keep (`reports.keep_hourly`) go."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from bot.services.context import SYSTEM, Context
from bot.services.overview import BUSY_PCT
from storage import keyvalue, rollups
from storage.rollup_spans import HOUR
from storage.rollups import floor_hour

log = logging.getLogger(__name__)

#: How long the per-minute history is kept (the retention job); a first rollup looks no further
#: back, and the retention job never drops a minute the rollup has not rolled yet, nor one of the
#: hours it rolls again (AGAIN).
MINUTES_KEPT = timedelta(days=30)
#: The hours rolled last, rolled again with the next completed hour, for late agent pushes.
AGAIN = 2 * HOUR
DAY = timedelta(days=1)


#: One pass at a time in this process: the rollup job and a digest that waits for it.
_ROLLING = threading.Lock()


def run(ctx: Context, now: datetime) -> int:
    """Roll every completed hour not rolled yet, and the two rolled last again, each hour in a
    short transaction of its own; returns the hourly rows written. Does nothing until another
    hour has completed."""
    with _ROLLING:
        return _run(ctx, now)


def _run(ctx: Context, now: datetime) -> int:
    current = floor_hour(now)
    with ctx.db.read() as session:
        rolled = keyvalue.rolled_until(session)
        if rolled is not None and rolled >= current:
            return 0
        if rolled is None:
            first = rollups.earliest(session, floor_hour(now - MINUTES_KEPT))
            since = current if first is None else floor_hour(first)
        else:
            since = rolled - AGAIN
    written, start = 0, since
    while start < current:  # a day's leases read at a time, however long the bot was down
        end = min(start + DAY, current)
        written += _roll(ctx, start, end, rolled, now)
        start = end
    with ctx.db.write() as session:
        keyvalue.set_rolled_until(session, current, at=now, by=SYSTEM)
        rollups.prune(session, now - ctx.policy.reports.keep_hourly)
    hours = int((current - since) / HOUR)
    if hours > 1 + AGAIN // HOUR:
        log.info(
            "rollup: %d hours rolled (%d hourly rows), caught up to %s", hours, written, current
        )
    return written


def _roll(
    ctx: Context, since: datetime, until: datetime, rolled: datetime | None, now: datetime
) -> int:
    """The hours in [since, until): each read, then written with the marker moved past it."""
    with ctx.db.read() as session:
        spans = rollups.held(session, since, until)
    written = 0
    for hour in rollups.hours(since, until):
        with ctx.db.read() as session:
            rows = rollups.hour_rows(session, hour, spans, busy_pct=BUSY_PCT)
        with ctx.db.write() as session:
            written += rollups.replace(session, hour, hour + HOUR, rows)
            done = hour + HOUR if rolled is None else max(rolled, hour + HOUR)
            keyvalue.set_rolled_until(session, done, at=now, by=SYSTEM)
    return written
