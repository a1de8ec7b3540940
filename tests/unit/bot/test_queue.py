"""Waiting requests are granted when GPUs come free: highest priority first, then arrival;
the head is never overtaken; the rules are asked again at that moment."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import col, select

from bot.services import BorrowAsk, Services
from bot.services.results import ExtendResult, SettleResult
from rules.domain import Outcome, Priority
from storage.tables import AuditRow, OutboxRow
from tests.unit.bot.conftest import ALICE, BOB, CAROL, ERIN, NADIA, VICTOR, Clock, borrowed

pytestmark = pytest.mark.usefixtures("services")
DAVE, PRIYA = "U0DAVE001", "U0PMGR001"


def full_a100(services: Services) -> int:
    """vision 8 and nlp 8 (6 + 2 borrowed with nadia's approval): no a100 GPU left."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    borrowed(services, CAROL, BorrowAsk("a100", 6))
    asked = borrowed(services, DAVE, BorrowAsk("a100", 2))
    assert isinstance(services.approve(NADIA, asked.request.id), SettleResult)
    lease = services.leases(DAVE)[0]
    return lease.id


def test_a_release_grants_the_head_of_the_queue_and_owes_its_dm(services: Services) -> None:
    """Erin waits inside her nominal; Dave releases; Erin's request becomes a lease."""
    dave_lease = full_a100(services)
    waiting = borrowed(services, ERIN, BorrowAsk("a100", 1))
    assert Outcome.QUEUE == waiting.outcome
    services.release(DAVE, dave_lease)
    assert 1 == len(services.leases(ERIN))
    assert "approved" == services.request(waiting.request.id).state  # type: ignore[union-attr]
    with services.db.read() as session:
        tags = session.exec(select(AuditRow.tag).order_by(col(AuditRow.id))).all()
        dms = session.exec(
            select(OutboxRow.recipient).where(OutboxRow.kind == "lease_granted")
        ).all()
    assert "queue:granted" == tags[-1]
    assert ERIN in dms


def test_high_priority_waits_ahead_and_the_head_is_not_overtaken(
    services: Services, clock: Clock
) -> None:
    """A normal request first, a high one later: the high one is served first; a small
    request behind a big head keeps waiting even when it alone would fit."""
    dave_lease = full_a100(services)
    first = borrowed(services, ERIN, BorrowAsk("a100", 1))
    clock.advance(timedelta(minutes=1))
    urgent = borrowed(services, PRIYA, BorrowAsk("a100", 1, priority=Priority.HIGH))
    assert Outcome.QUEUE == first.outcome == urgent.outcome
    services.release(DAVE, dave_lease)  # two GPUs free: both fit, the high one goes first
    granted = sorted(services.leases(PRIYA) + services.leases(ERIN), key=lambda lease: lease.id)
    assert [PRIYA, ERIN] == [lease.holder for lease in granted]


def test_serving_the_queue_again_changes_nothing(services: Services) -> None:
    """The sweep job serves the queue every minute; with nothing new, nothing happens."""
    dave_lease = full_a100(services)
    borrowed(services, ERIN, BorrowAsk("a100", 1))
    services.release(DAVE, dave_lease)
    assert [] == services.serve_queue()  # nothing left waiting: a second pass changes nothing


def test_a_request_waiting_longer_than_the_limit_is_withdrawn_and_told(
    services: Services, clock: Clock
) -> None:
    """After max_queue_wait (1d in the shipped limits) the request leaves the queue."""
    full_a100(services)
    waiting = borrowed(services, ERIN, BorrowAsk("a100", 1))
    clock.advance(timedelta(hours=23))
    assert [] == services.serve_queue()
    assert "queued" == services.request(waiting.request.id).state  # type: ignore[union-attr]
    clock.advance(timedelta(hours=2))
    services.serve_queue()
    assert "cancelled" == services.request(waiting.request.id).state  # type: ignore[union-attr]
    with services.db.read() as session:
        told = session.exec(
            select(OutboxRow).where(
                OutboxRow.kind == "request_decided", OutboxRow.recipient == ERIN
            )
        ).one()
        tags = session.exec(select(AuditRow.tag)).all()
    assert "timeout" == told.data["verdict"]
    assert "queue:timed-out" in tags
    assert [] == services.queue()


def test_an_extension_asks_a_manager_while_demand_that_outranks_it_waits(
    services: Services,
) -> None:
    """Alice would keep her nominal a100s longer: at once while only Bob's low-priority borrow
    waits; a manager decides once Priya's request, inside platform's nominal, waits."""
    full_a100(services)
    alice_lease = services.leases(ALICE)[0].id

    def extend() -> ExtendResult:
        result = services.extend(ALICE, alice_lease, timedelta(hours=1))
        assert isinstance(result, ExtendResult)
        return result

    bob = borrowed(services, BOB, BorrowAsk("a100", 1, priority=Priority.LOW))
    assert isinstance(services.approve(VICTOR, bob.request.id), SettleResult)
    assert "queued" == services.request(bob.request.id).state  # type: ignore[union-attr]
    assert Outcome.APPROVE == extend().outcome
    borrowed(services, PRIYA, BorrowAsk("a100", 1, priority=Priority.LOW))
    asked = extend()
    assert (Outcome.ASK, "extension-while-others-wait") == (asked.outcome, asked.deciding)
    assert "the queue in a100 serves 1 waiting request first" in asked.because


def test_a_request_inside_nominal_is_served_before_a_borrow_of_higher_priority(
    services: Services,
) -> None:
    """Bob's approved high-priority borrow waits; Priya asks later, at low priority but inside
    platform's nominal: she is first in line, and the next free GPU is hers."""
    dave_lease = full_a100(services)
    bob = borrowed(services, BOB, BorrowAsk("a100", 1, priority=Priority.HIGH))
    assert isinstance(services.approve(VICTOR, bob.request.id), SettleResult)
    priya = borrowed(services, PRIYA, BorrowAsk("a100", 1, priority=Priority.LOW))
    assert [priya.request.id, bob.request.id] == [r.id for r in services.queue()]
    services.release(DAVE, dave_lease)  # two GPUs come free: Priya first, then Bob
    assert 1 == len(services.leases(PRIYA)) == len(services.leases(BOB))


def test_borrowers_are_served_by_fair_share_not_arrival(services: Services, clock: Clock) -> None:
    """l40s: nlp used 3 GPUs for 10h this morning. With the pool full, Dave (nlp) and then Bob
    (vision) each borrow 1, their managers agreeing: Bob's team used less lately, so he comes
    first, and gets the GPU that Erin gives back."""
    morning = borrowed(services, CAROL, BorrowAsk("l40s", 3, timedelta(hours=12)))
    clock.advance(timedelta(hours=10))
    assert morning.lease is not None
    services.release(CAROL, morning.lease.id)
    borrowed(services, CAROL, BorrowAsk("l40s", 3, timedelta(hours=8)))
    borrowed(services, ALICE, BorrowAsk("l40s", 3, timedelta(hours=8)))
    erin = [borrowed(services, ERIN, BorrowAsk("l40s", 1, timedelta(hours=8))) for _ in range(2)]
    dave = borrowed(services, DAVE, BorrowAsk("l40s", 1, timedelta(hours=2)))
    clock.advance(timedelta(minutes=1))
    bob = borrowed(services, BOB, BorrowAsk("l40s", 1, timedelta(hours=2)))
    for manager, asked in ((NADIA, dave), (VICTOR, bob)):
        assert Outcome.ASK == asked.outcome
        assert isinstance(services.approve(manager, asked.request.id), SettleResult)
    assert [bob.request.id, dave.request.id] == [r.id for r in services.queue()]
    first = erin[0].lease
    assert first is not None
    services.release(ERIN, first.id)
    assert [BOB] == [lease.holder for lease in services.leases(BOB)]
    assert [] == services.leases(DAVE)
