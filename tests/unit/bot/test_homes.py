"""Home tabs by role (researcher, manager, admin), the Home rows every change owes, the pause
switch's wording and drains that name and tell the holders."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from sqlmodel import select

from bot.services import BorrowAsk, Refused, Services
from bot.services.homes import HOME_EVERY
from bot.services.results import ExtendResult, SettleResult
from rules.domain import Outcome
from storage import gpus, outbox
from storage.tables import GpuMinuteRow, OutboxRow
from tests.unit.bot.conftest import (
    ADA,
    ALICE,
    BOB,
    CAROL,
    ERIN,
    NADIA,
    VICTOR,
    Clock,
    borrowed,
)

pytestmark = pytest.mark.usefixtures("services")
DAVE = "U0DAVE001"  # nlp member
PRIYA = "U0PMGR001"  # platform manager


def owed(services: Services, kind: str) -> list[OutboxRow]:
    with services.db.read() as session:
        return list(session.exec(select(OutboxRow).where(OutboxRow.kind == kind)).all())


def homes_owed(services: Services) -> list[str]:
    return sorted(r.recipient for r in owed(services, "home"))


def full_a100(services: Services) -> None:
    """vision 8 and nlp 8 (6 + 2 borrowed with Nadia's approval): no a100 GPU left."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    borrowed(services, CAROL, BorrowAsk("a100", 6))
    asked = borrowed(services, DAVE, BorrowAsk("a100", 2))
    assert isinstance(services.approve(NADIA, asked.request.id), SettleResult)


def test_a_researcher_sees_leases_requests_places_quota_and_the_week(
    services: Services, clock: Clock
) -> None:
    """Erin's lease, her queued request with its place, platform's quota, GPU-hours held and
    (from the per-minute history, nothing rolled up yet) used, busy and idle, and their cost."""
    lease = borrowed(services, ERIN, BorrowAsk("l40s", 1)).lease
    assert lease is not None
    with services.db.write() as session:  # busy for the first 30 of the 60 minutes
        node, index = lease.gpus[0].node, lease.gpus[0].index
        minutes = [
            GpuMinuteRow(
                node=node,
                index=index,
                minute=clock.now + timedelta(minutes=m),
                util_avg_pct=90.0 if m < 30 else 0.0,
                samples=2,
                ok_samples=2,
            )
            for m in range(60)
        ]
        gpus.store_minutes(session, minutes)
    clock.advance(timedelta(hours=1))
    full_a100(services)
    queued = borrowed(services, ERIN, BorrowAsk("a100", 1))
    assert Outcome.QUEUE == queued.outcome
    home = services.home(ERIN)
    assert [lease.id] == [x.id for x in home.leases]
    assert {queued.request.id: 1} == dict(home.places)
    assert {"a100", "l40s", "inference"} == {q.pool for q in home.quotas}
    assert home.week is not None
    week = home.week.usage  # 30 minutes at 90 %: 0.45 GPU-h used; l40s at 1.10 an hour
    assert (1.0, 0.45, 0.5, 0.5, 1.1, True) == (
        round(week.allocated_h, 2),
        round(week.used_h, 2),
        week.busy_s / 3600,
        week.idle_h,
        round(week.cost, 2),
        home.week.priced,
    )
    assert (False, False, None, ()) == (home.admin, home.manager, home.fleet, home.waiting)


def test_a_manager_sees_what_waits_for_them_and_their_teams_work(services: Services) -> None:
    """Victor: Bob's request over vision's quota, oldest first, and vision's leases; Nadia
    (nlp) is not asked and sees nlp's work only."""
    services.borrow(ALICE, BorrowAsk("a100", 8))
    first = borrowed(services, BOB, BorrowAsk("a100", 2))
    second = borrowed(services, BOB, BorrowAsk("a100", 1))
    assert Outcome.ASK == first.outcome
    home = services.home(VICTOR)
    assert [first.request.id, second.request.id] == [r.id for r in home.waiting]
    assert ["vision"] == [t.team for t in home.managed]
    assert [ALICE] == [lease.holder for lease in home.managed[0].leases]
    assert {first.request.id, second.request.id} == {r.id for r in home.managed[0].requests}
    nadia = services.home(NADIA)
    assert () == nadia.waiting
    assert ["nlp"] == [t.team for t in nadia.managed]
    assert () == nadia.managed[0].leases


def test_an_extension_asked_of_a_manager_waits_on_their_home(services: Services) -> None:
    """Vision borrows beyond its nominal, so Bob's extension asks Victor: it is on his Home
    as "extend L… by 2h", with the same buttons as a borrow."""
    services.borrow(ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    assert isinstance(services.approve(VICTOR, asked.request.id), SettleResult)
    lease = services.leases(BOB)[0]
    extension = services.extend(BOB, lease.id, timedelta(hours=2))
    assert isinstance(extension, ExtendResult)
    assert Outcome.ASK == extension.outcome
    waiting = services.home(VICTOR).waiting
    assert [("extend", lease.id)] == [(r.kind, r.lease_id) for r in waiting]


def test_nobody_is_shown_their_own_request_as_waiting_for_them(services: Services) -> None:
    """An admin who borrows is asked like anyone, but never by their own Home."""
    services.borrow(ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    assert [asked.request.id] == [r.id for r in services.home(ADA).waiting]
    assert () == services.home(BOB).waiting


def test_an_admin_sees_the_fleet_drained_nodes_and_the_queue(services: Services) -> None:
    """Ada is in no team: the fleet (with the drained node and its GPUs), the queue."""
    assert isinstance(services.drain(ADA, "l40s-node-02"), str)
    full_a100(services)
    queued = borrowed(services, ERIN, BorrowAsk("a100", 1))
    home = services.home(ADA)
    assert (True, None) == (home.admin, home.team)
    assert home.fleet is not None
    assert ("l40s-node-02",) == home.fleet.drained
    l40s = next(p for p in home.pools if p.name == "l40s")
    assert (8, 4, 4) == (l40s.size, l40s.free, l40s.drained)
    assert [queued.request.id] == [r.id for r in home.fleet.queue]
    assert services.home(ALICE).fleet is None


def pending_homes(services: Services) -> Counter[str]:
    """Who has a Home row waiting; then every row is taken as sent."""
    with services.db.write() as session:
        rows = session.exec(select(OutboxRow).where(OutboxRow.state == "pending")).all()
        waiting = Counter(r.recipient for r in rows if r.kind == "home")
        for row in rows:
            outbox.delivered(session, row.id or 0, at=row.created_at, channel=None, ts=None)
    return waiting


def test_a_change_owes_one_home_to_each_person_who_sees_it(services: Services) -> None:
    """A grant: the holder, the team's managers and the admins, once each; a decision adds
    the requester's; an admin switch only the admins'."""
    pending_homes(services)
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    assert Counter([ADA, ALICE, VICTOR]) == pending_homes(services)
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    assert Counter([ADA, BOB, VICTOR]) == pending_homes(services)
    services.approve(VICTOR, asked.request.id)
    assert Counter([ADA, BOB, VICTOR]) == pending_homes(services)
    services.pause(ADA)
    assert Counter([ADA]) == pending_homes(services)


def test_an_end_and_a_grant_from_the_queue_owe_both_holders_a_home(services: Services) -> None:
    """Dave releases; Erin, waiting in the a100 queue, is granted: both holders, both teams'
    managers and the admins are owed a Home."""
    full_a100(services)
    waiting = borrowed(services, ERIN, BorrowAsk("a100", 1))
    assert Outcome.QUEUE == waiting.outcome
    pending_homes(services)
    services.release(DAVE)
    assert 1 == len(services.leases(ERIN))
    assert Counter([ADA, DAVE, ERIN, NADIA, PRIYA]) == pending_homes(services)


def test_a_request_the_rules_deny_at_once_owes_no_home(services: Services) -> None:
    """13 GPUs are denied as they are asked: no Home ever listed the request."""
    pending_homes(services)
    denied = borrowed(services, ALICE, BorrowAsk("a100", 13))
    assert Outcome.DENY == denied.outcome
    assert Counter() == pending_homes(services)


def test_homes_waiting_to_be_sent_fold_later_changes_in(services: Services) -> None:
    """Three grants in a row while nothing was sent: one Home row each, drawn when sent,
    not before HOME_EVERY has passed."""
    pending_homes(services)
    for pool in ("a100", "l40s", "a100"):
        borrowed(services, ALICE, BorrowAsk(pool, 1))
    with services.db.read() as session:
        rows = session.exec(select(OutboxRow).where(OutboxRow.kind == "home")).all()
        waiting = [r for r in rows if r.state == "pending"]
    assert Counter([ADA, ALICE, VICTOR]) == Counter(r.recipient for r in waiting)
    assert all(r.next_attempt_at == r.created_at + HOME_EVERY for r in waiting)


def test_pause_and_resume_say_when_the_switch_is_already_there(services: Services) -> None:
    """Resume while running, pause while paused: said so, nothing recorded twice."""
    assert "Automation is already running." == services.resume(ADA)
    assert services.pause(ADA) != "Automation is already paused."
    assert "Automation is already paused." == services.pause(ADA)
    assert "Automation resumed." == services.resume(ADA)
    assert isinstance(services.pause(ALICE), Refused)


def test_a_drain_names_the_holders_and_tells_each_by_dm(services: Services) -> None:
    """Alice holds GPUs on the drained node: the reply names her lease, she gets a DM saying
    her lease keeps its GPUs and why; an empty node's drain says no lease runs there."""
    lease = borrowed(services, ALICE, BorrowAsk("l40s", 2)).lease
    assert lease is not None
    node = lease.gpus[0].node
    reply = services.drain(ADA, node, "fan swap")
    assert isinstance(reply, str)
    assert f"L{lease.id} of <@{ALICE}>" in reply
    assert "Each holder was told by DM." in reply
    told = [r for r in owed(services, "notice") if r.recipient == ALICE]
    assert 1 == len(told)
    text = str(told[0].data["text"])
    assert all(part in text for part in (f"<@{ADA}> drained `{node}` (fan swap)", "keeps"))
    other = next(n for n in ("l40s-node-01", "l40s-node-02") if n != node)
    assert f"`{other}` is drained. No lease runs on it." == services.drain(ADA, other)
