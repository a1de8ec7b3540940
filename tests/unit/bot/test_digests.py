"""Scheduled digests owed through the outbox: once per period under a key, even when the sweep
runs again, a second process owes at once, or automation is paused; and what each one says."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlmodel import col, select

from bot.services import BorrowAsk, Services, rollups
from bot.services import digests as digest_service
from bot.services.digests import LabDigest, PersonalDigest
from rules.digests import Period, due_period
from storage import keyvalue
from storage.db import Database
from storage.tables import GpuHourRow, LeaseRow, OutboxRow, RequestRow, SettingRow
from tests.builders import default_sources
from tests.unit.bot.conftest import ADA, ALICE, CAROL, T0, Clock, borrowed

LAB_CHANNEL = "C0LABGPU1"
# Monday 2 March 2026 09:00 in Berlin is 08:00 UTC; T0 is 09:00 UTC, an hour after.
SENT_AT = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
WEEK_START = datetime(2026, 2, 23, 8, 0, tzinfo=UTC)
SCHEDULES = f"""
  lab_digest: {{channel: {LAB_CHANNEL}, day: mon, at: "09:00", tz: Europe/Berlin}}
  personal_digests: {{day: mon, at: "09:00", tz: Europe/Berlin}}
"""


def digest_sources() -> dict[str, str]:
    sources = default_sources()
    sources["reports.yaml"] += SCHEDULES
    return sources


@pytest.fixture
def services(database: Database, clock: Clock) -> Iterator[Services]:
    """The shipped rules with a weekly lab digest and weekly personal digests."""
    svc = Services.open(database, digest_sources(), clock=clock)
    yield svc
    svc.close()


def held(
    services: Services,
    lease: int,
    holder: str,
    team: str,
    first: datetime,
    *,
    hours: int,
    used_s: float = 0.0,
    busy_s: float = 0.0,
    idle_s: float = 0.0,
) -> None:
    """One GPU of `lease` held whole hours from `first`, each hour with these seconds."""
    with services.ctx.db.write() as session:
        session.add_all(
            GpuHourRow(hour=first + timedelta(hours=h), pool="a100", node="a100-node-01",
                       index=lease, team=team, holder=holder, lease_id=lease, allocated_s=3600,
                       used_s=used_s, busy_s=busy_s, idle_s=idle_s)
            for h in range(hours)
        )  # fmt: skip


def seed_week(services: Services) -> None:
    """Alice's L1: 4 GPU-h at half use, 1 h of it idle; Carol's L2: 2 GPU-h, both idle and
    unused; and an hour of Alice's after the window (not counted). The rollup's marker past
    every hour these tests read: the hand-written rows stand for what it rolled."""
    with services.ctx.db.write() as session:
        keyvalue.set_rolled_until(session, T0 + timedelta(days=30), at=T0, by="test")
    first = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    held(services, 1, ALICE, "vision", first, hours=4, used_s=1800, busy_s=2700, idle_s=900)
    held(services, 2, CAROL, "nlp", first, hours=2, idle_s=3600)
    held(services, 1, ALICE, "vision", SENT_AT, hours=1, used_s=3600, busy_s=3600)
    with services.ctx.db.write() as session:
        for lease, holder, team in ((1, ALICE, "vision"), (2, CAROL, "nlp")):
            session.add(LeaseRow(id=lease, holder=holder, team=team, pool="a100", gpus=1,
                                 state="released", granted_at=first,
                                 expires_at=first + timedelta(hours=4)))  # fmt: skip


@pytest.fixture
def week(services: Services) -> Services:
    seed_week(services)
    return services


def digests(services: Services) -> list[tuple[str, str, str | None]]:
    with services.ctx.db.read() as session:
        rows = session.exec(
            select(OutboxRow).where(OutboxRow.kind == "digest").order_by(col(OutboxRow.id))
        ).all()
    return [(r.subject, r.recipient, r.dedupe_key) for r in rows]


def test_due_digests_are_owed_once_per_period(week: Services, clock: Clock) -> None:
    """The lab's to its channel, and one to each person who held GPUs in the week."""
    assert 3 == week.send_digests()
    expected = [
        ("digest:lab", LAB_CHANNEL, "digest:lab:2026-W10"),
        ("digest:U0ALICE01", ALICE, "digest:U0ALICE01:2026-W10"),
        ("digest:U0CAROL01", CAROL, "digest:U0CAROL01:2026-W10"),
    ]
    assert expected == digests(week)
    for later in (timedelta(minutes=1), timedelta(days=6, hours=22)):  # Mon 10:01 .. Mon 08:00
        clock.now = T0 + later
        assert 0 == week.send_digests()
    clock.now = T0 + timedelta(days=7)  # the next Monday: Alice held a GPU in that week
    assert 2 == week.send_digests()
    assert [k for _, _, k in digests(week)][3:] == [
        "digest:lab:2026-W11",
        "digest:U0ALICE01:2026-W11",
    ]


def test_a_second_process_owing_the_same_period_adds_nothing(week: Services) -> None:
    """Two processes that both read the period as not sent yet: the keys keep one of each."""
    assert 3 == week.send_digests()
    with week.ctx.db.write() as session:  # as the other process saw it: nothing sent
        for row in session.exec(select(SettingRow)).all():
            if row.key.startswith("digest:"):
                session.delete(row)
    assert 0 == week.send_digests()
    assert 3 == len(digests(week))


def test_two_racing_runs_owe_each_digest_once(
    shared_db: Database, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two bot processes read the period as unsent before either has written: one set of
    messages, and neither run fails."""
    both_read = threading.Barrier(2)

    def slow_due(*args: Any) -> Period | None:
        found = due_period(*args)
        both_read.wait(timeout=5)  # both have read "not sent yet" before either writes
        return found

    monkeypatch.setattr(digest_service, "due_period", slow_due)
    first, second = (Services.open(shared_db, digest_sources(), clock=clock) for _ in range(2))
    try:
        seed_week(first)
        with ThreadPoolExecutor(max_workers=2) as pool:
            owed = [f.result() for f in [pool.submit(s.send_digests) for s in (first, second)]]
        assert 3 == sum(owed)
        assert 3 == len(digests(first))
    finally:
        first.close()
        second.close()


def test_digests_go_out_while_automation_is_paused(week: Services) -> None:
    """The kill switch stops what takes GPUs away; a digest only reports."""
    week.pause(ADA)
    assert week.paused()
    assert 3 == week.send_digests()


def test_no_digest_is_owed_before_its_first_send_time(week: Services, clock: Clock) -> None:
    """08:59 Berlin on Monday 2 March: the week of 16 February was the latest; once that is
    recorded as sent, nothing more until 09:00."""
    clock.now = SENT_AT - timedelta(minutes=1)
    assert 1 == week.send_digests()  # the lab's for W09; nobody held GPUs then
    assert 0 == week.send_digests()
    clock.now = SENT_AT
    assert 3 == week.send_digests()


def test_rules_without_digests_owe_nothing(database: Database, clock: Clock) -> None:
    services = Services.open(database, default_sources(), clock=clock)
    try:
        assert 0 == services.send_digests()
    finally:
        services.close()


def test_the_lab_digest_reads_the_week_by_team_with_the_idle_leases(week: Services) -> None:
    week.send_digests()
    with week.ctx.db.read() as session:
        lab = session.exec(select(OutboxRow).where(OutboxRow.recipient == LAB_CHANNEL)).one()
    view = week.digest(lab)
    assert isinstance(view, LabDigest)
    usage = view.report.figures.usage
    # 4 h + 2 h held; 4 x 0.5 h used; 4 x 0.25 h + 2 h idle; the hour after the window left out
    assert (6.0, 2.0, 3.0) == (usage.allocated_h, usage.used_h, usage.idle_h)
    assert pytest.approx(6 * 2.40) == usage.cost  # a100 at 2.40 an hour
    assert (WEEK_START, SENT_AT, "week of Feb 23") == (
        view.report.window.since,
        view.report.window.until,
        view.report.window.label,
    )
    assert ["vision", "nlp"] == [line.key for line in view.report.lines]
    assert [("L2", "nlp", "a100", 2.0), ("L1", "vision", "a100", 1.0)] == [
        (lease.code, lease.team, lease.pool, lease.usage.idle_h) for lease in view.idle
    ]


def test_digests_count_the_requests_of_the_week_still_waiting(week: Services) -> None:
    """Alice asked Sunday 09:00 and still waits at Monday 09:00 UTC (24 h); Carol's request
    was denied: the lab's digest and Alice's show one waiting, Carol's none."""
    with week.ctx.db.write() as session:
        for who, team, state in ((ALICE, "vision", "queued"), (CAROL, "nlp", "denied")):
            session.add(RequestRow(
                kind="borrow", requester=who, team=team, pool="a100", gpus=1, duration_s=3600,
                state=state, outcome="approve",
                created_at=datetime(2026, 3, 1, 9, 0, tzinfo=UTC),
            ))  # fmt: skip
    week.send_digests()
    found = {}
    with week.ctx.db.read() as session:
        rows = session.exec(
            select(OutboxRow).where(OutboxRow.kind == "digest").order_by(col(OutboxRow.id))
        ).all()
    for row in rows:
        view = week.digest(row)
        assert view is not None
        found[row.recipient] = (
            view.report.figures.still_waiting,
            view.report.figures.oldest_wait_s,
        )
    assert {LAB_CHANNEL: (1, 86400.0), ALICE: (1, 86400.0), CAROL: (0, None)} == found


def test_a_personal_digest_reads_only_that_persons_week(week: Services) -> None:
    week.send_digests()
    with week.ctx.db.read() as session:
        mine = session.exec(select(OutboxRow).where(OutboxRow.recipient == ALICE)).one()
    view = week.digest(mine)
    assert isinstance(view, PersonalDigest)
    usage = view.report.figures.usage
    assert (ALICE, 4.0, 2.0, 0.5) == (view.person, usage.allocated_h, usage.used_h,
                                      usage.efficiency)  # fmt: skip


def test_a_quiet_hour_before_the_send_time_does_not_delay_the_digest(
    services: Services, clock: Clock
) -> None:
    """The rollup has rolled to 08:00 (the end of the week) but nobody held a GPU after Sunday
    11:00: the digests go at 09:00 Berlin on the dot, the rollup's marker says so."""
    held(services, 1, ALICE, "vision", datetime(2026, 3, 1, 10, 0, tzinfo=UTC), hours=1)
    with services.ctx.db.write() as session:
        keyvalue.set_rolled_until(session, SENT_AT, at=SENT_AT, by="test")
    clock.now = SENT_AT
    assert 2 == services.send_digests()  # the lab's and Alice's


def test_after_three_hours_down_the_digest_rolls_the_missing_hours_first(
    services: Services, clock: Clock
) -> None:
    """Alice holds an L40S from 04:00 UTC, rolled to 05:00; Carol borrows one at 06:00 and
    the bot is down from 05:05 to 10:00, past the send time (08:00 UTC) and its hour of grace:
    the digests wait for the rollup, so the lab's week holds Alice's 4 h and Carol's 2 h to
    08:00, and Carol gets hers too."""
    clock.now = SENT_AT - 4 * timedelta(hours=1)
    borrowed(services, ALICE, BorrowAsk("l40s", 1, timedelta(hours=12)))
    rollups.run(services.ctx, clock.now + timedelta(hours=1, minutes=5))
    clock.now = SENT_AT - 2 * timedelta(hours=1)
    borrowed(services, CAROL, BorrowAsk("l40s", 1, timedelta(hours=12)))
    clock.now = SENT_AT + 2 * timedelta(hours=1)
    assert 3 == services.send_digests()
    with services.ctx.db.read() as session:
        lab = session.exec(select(OutboxRow).where(OutboxRow.recipient == LAB_CHANNEL)).one()
    view = services.digest(lab)
    assert isinstance(view, LabDigest)
    assert [("vision", 4.0), ("nlp", 2.0)] == [
        (line.key, line.usage.allocated_h) for line in view.report.lines
    ]
    assert [LAB_CHANNEL, ALICE, CAROL] == [recipient for _, recipient, _ in digests(services)]


@pytest.mark.parametrize(
    ("period", "sent_at", "since", "hours", "days"),
    [
        # Spring: Monday 30 March 09:00 is CEST (07:00 UTC); the week began at 09:00 CET on
        # the 23rd (08:00 UTC): 167 hours, and Sunday 29 March has 23.
        ("2026-W14", datetime(2026, 3, 30, 7, 0, tzinfo=UTC),
         datetime(2026, 3, 23, 8, 0, tzinfo=UTC), 167,
         [15, 24, 24, 24, 24, 24, 23, 9]),
        # Autumn: Monday 26 October 09:00 is CET (08:00 UTC); the week began at 09:00 CEST on
        # the 19th (07:00 UTC): 169 hours, and Sunday 25 October has 25.
        ("2026-W44", datetime(2026, 10, 26, 8, 0, tzinfo=UTC),
         datetime(2026, 10, 19, 7, 0, tzinfo=UTC), 169,
         [15, 24, 24, 24, 24, 24, 25, 9]),
    ],
)  # fmt: skip
def test_a_week_across_a_clock_change_goes_out_at_local_nine_and_holds_its_real_hours(  # noqa: PLR0917 - a parametrized table
    services: Services, clock: Clock, period: str, sent_at: datetime, since: datetime,
    hours: int, days: list[int],
) -> None:  # fmt: skip
    """Alice holds one GPU every hour around Berlin's clock change: the digest goes out at
    09:00 on the new clock, once, and its week is the hours between two local 09:00s, each
    local day with the hours it really had."""
    first = since - timedelta(days=1)
    held(services, 1, ALICE, "vision", first, hours=hours + 48, used_s=1800, busy_s=3600)
    with services.ctx.db.write() as session:
        keyvalue.set_rolled_until(session, sent_at + timedelta(days=2), at=first, by="test")
    clock.now = sent_at - timedelta(minutes=1)  # 08:59 in Berlin: the week before's
    assert 2 == services.send_digests()
    clock.now = sent_at
    assert 2 == services.send_digests()
    clock.now = sent_at + timedelta(hours=1)  # the old clock's 09:00: nothing more
    assert 0 == services.send_digests()
    keys = [key for _, _, key in digests(services)][2:]
    assert [f"digest:lab:{period}", f"digest:U0ALICE01:{period}"] == keys
    with services.ctx.db.read() as session:
        rows = session.exec(
            select(OutboxRow).where(OutboxRow.kind == "digest").order_by(col(OutboxRow.id))
        ).all()
    lab, mine = (services.digest(row) for row in rows[2:])
    assert isinstance(lab, LabDigest)
    assert isinstance(mine, PersonalDigest)
    window = lab.report.window
    assert (since, sent_at) == (window.since, window.until)
    assert (hours, hours / 2) == (lab.report.figures.usage.allocated_h,
                                  lab.report.figures.usage.used_h)  # fmt: skip
    assert days == [round(day.usage.allocated_h) for day in lab.report.days]
    assert hours == mine.report.figures.usage.allocated_h
