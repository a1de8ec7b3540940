"""Scheduled usage digests: the lab's report posted in a channel and each person's own by DM,
owed through the outbox once per period (`rules.digests` says which period is due). A period
waits for the hourly rollup's marker to reach its end; when the marker is behind, the rollup
runs first in the same pass, so a digest after a restart holds every hour of its window.

A digest reports and takes nothing, so it goes out whether or not automation is paused. Each
message is owed under a key per period ("digest:lab:2026-W49", "digest:U123:2026-W49"): a sweep
run twice, two processes at once, or a restart never owe it a second time. What it says is read
when it is delivered (`view`), from the hourly rollups of its window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from zoneinfo import ZoneInfo

from sqlmodel import Session

from bot.services import reports as report_service
from bot.services import rollups
from bot.services.context import SYSTEM, Context
from rules.digests import Period, due_period, ready
from rules.policy import Digest
from rules.reports import Report, Scope, ScopeKind, Usage, Window
from storage import keyvalue, outbox
from storage import leases as storage_leases
from storage import reports as storage_reports
from storage.outbox import OutboxKind, Owed
from storage.reports import Filter
from storage.tables import OutboxRow

LAB, PERSONAL = "lab", "personal"
TOP_IDLE = 5  # the leases a lab digest names for the most GPU time held idle


@dataclass(frozen=True)
class IdleLease:
    """A lease that held GPUs idle in the window: its code, team, pool and use there (no
    person: the lab digest is posted in a channel)."""

    code: str
    team: str
    pool: str
    usage: Usage


@dataclass(frozen=True)
class LabDigest:
    """The lab's period: figures, a line per team, and the leases that held most GPU time
    idle. `first_day` and `days`: the local dates the window covers."""

    report: Report
    idle: tuple[IdleLease, ...]
    first_day: date
    days: int


@dataclass(frozen=True)
class PersonalDigest:
    """One person's period: their own figures, by pool."""

    person: str
    report: Report
    first_day: date
    days: int


def run(ctx: Context, now: datetime) -> int:
    """Owe every digest due at `now` that was not owed yet; how many messages were owed."""
    settings = ctx.policy.reports
    due: list[tuple[str, Digest, Period]] = []
    with ctx.db.read() as session:
        for name, digest in ((LAB, settings.lab_digest), (PERSONAL, settings.personal_digests)):
            if digest is None or (name == LAB and not digest.channel):
                continue
            period = due_period(digest, now, keyvalue.digest_sent(session, name))
            if period is not None:
                due.append((name, digest, period))
        rolled = keyvalue.rolled_until(session) if due else None
    if any(rolled is None or rolled < period.until for _, _, period in due):
        # Behind (the bot was down, or the rollup job has not looked yet): roll the completed
        # hours first, so the digest never goes out without them.
        rollups.run(ctx, now)
        with ctx.db.read() as session:
            rolled = keyvalue.rolled_until(session)
    due = [(name, d, period) for name, d, period in due if ready(period, now, rolled)]
    if not due:
        return 0
    owed = 0
    with ctx.db.write() as session:
        for name, digest, period in due:
            owed += _owe(session, name, digest, period, now)
            keyvalue.mark_digest_sent(session, name, period.key, at=now, by=SYSTEM)
    return owed


def _owe(session: Session, name: str, digest: Digest, period: Period, now: datetime) -> int:
    data = {
        "digest": name,
        "period": period.key,
        "since": period.since.isoformat(),
        "until": period.until.isoformat(),
        "first_day": period.first_day.isoformat(),
        "days": period.days,
        "tz": digest.tz,
    }
    if name == LAB:
        assert digest.channel is not None
        recipients = [(LAB, digest.channel)]
    else:
        recipients = [(person, person) for person in _holders(session, period)]
    owed = 0
    for who, recipient in recipients:
        message = Owed(OutboxKind.DIGEST, f"digest:{who}", recipient, data)
        if outbox.owe(session, message, at=now, key=f"digest:{who}:{period.key}") is not None:
            owed += 1
    return owed


def _holders(session: Session, period: Period) -> list[str]:
    """Everyone who held GPUs in the period (by the hourly rollups)."""
    held = storage_reports.usage(session, period.since, period.until, Filter(), "holder", prices={})
    return sorted(holder for holder, use in held.items() if holder and use.allocated_s > 0)


def view(ctx: Context, row: OutboxRow) -> LabDigest | PersonalDigest | None:
    """What an owed digest says, read now; None when there is nothing to say (the person may
    no longer see their own report, or the rule files no longer name the digest's kind)."""
    data = row.data
    tz = ZoneInfo(str(data["tz"]))
    first_day, days = date.fromisoformat(str(data["first_day"])), int(data["days"])
    label = (
        f"week of {first_day:%b} {first_day.day}"
        if days == 7
        else f"{first_day:%b} {first_day.day}"
    )
    window = Window(
        datetime.fromisoformat(str(data["since"])),
        datetime.fromisoformat(str(data["until"])),
        label,
    )
    if data["digest"] == LAB:
        report = report_service.build(ctx, SYSTEM, Scope(ScopeKind.LAB), window, by="team", tz=tz)
        if not isinstance(report, Report):
            return None
        return LabDigest(report, _idle_leases(ctx, window), first_day, days)
    if data["digest"] == PERSONAL:
        mine = report_service.build(ctx, row.recipient, Scope(ScopeKind.ME), window, tz=tz)
        if not isinstance(mine, Report):
            return None
        return PersonalDigest(row.recipient, mine, first_day, days)
    return None


def _idle_leases(ctx: Context, window: Window) -> tuple[IdleLease, ...]:
    """The leases that held the most GPU time idle in the window, most first."""
    with ctx.db.read() as session:
        by_lease = storage_reports.usage(
            session, window.since, window.until, Filter(), "lease", prices={}
        )
        idle = sorted(
            ((key, use) for key, use in by_lease.items() if key and use.idle_s > 0),
            key=lambda kv: (-kv[1].idle_s, kv[0]),
        )[:TOP_IDLE]
        out = []
        for key, use in idle:
            lease = storage_leases.get(session, int(key.removeprefix("L")))
            if lease is not None:
                out.append(IdleLease(key, lease.team, lease.pool, use))
    return tuple(out)
