"""Read-only answers and admin switches: status, quota, queue, home, pause, drain, audit."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.services import BorrowAsk, Refused, Services
from bot.services.results import BorrowResult, Explanation
from rules.domain import Outcome, Priority
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, ERIN, NADIA, Clock

pytestmark = pytest.mark.usefixtures("services")


def test_status_counts_free_leased_and_out_of_service_by_pool(services: Services) -> None:
    """A lease and a drained node show up in the pool's figures."""
    services.borrow(ALICE, BorrowAsk("l40s", 3))
    assert isinstance(services.drain(ADA, "l40s-node-02"), str)
    l40s = next(p for p in services.status() if p.name == "l40s")
    assert (8, 1, 3, 4) == (l40s.size, l40s.free, l40s.leased, l40s.unhealthy)
    assert "NVIDIA L40S" == l40s.models[0].model
    assert next(p for p in services.status() if p.name == "inference").protected


def test_a_drained_node_takes_no_new_lease(services: Services) -> None:
    """Drain keeps new leases off a node; undrain brings it back."""
    services.drain(ADA, "l40s-node-01")
    result = services.borrow(ALICE, BorrowAsk("l40s", 2))
    assert isinstance(result, BorrowResult)
    assert result.lease is not None
    assert {"l40s-node-02"} == set(result.lease.by_node)
    assert "`l40s-node-01` is back in service." == services.undrain(ADA, "l40s-node-01")
    assert isinstance(services.drain(ALICE, "l40s-node-01"), Refused)
    refused = services.drain(ADA, "l40s-node-9")
    assert isinstance(refused, Refused)
    assert "There is no node `l40s-node-9`" in refused.message


def test_quota_shows_use_against_nominal_and_borrowing(services: Services) -> None:
    """A team's quota per pool with what it holds and borrows."""
    services.borrow(ALICE, BorrowAsk("a100", 8))
    asked = services.borrow(BOB, BorrowAsk("a100", 2))
    assert isinstance(asked, BorrowResult)
    services.approve(ADA, asked.request.id)
    quotas = services.quota("vision")
    assert not isinstance(quotas, Refused)
    a100 = next(q for q in quotas if q.pool == "a100")
    assert (8, 4, 10, 2) == (a100.nominal, a100.borrowing_limit, a100.used, a100.borrowed)
    assert isinstance(services.quota("robots"), Refused)


def test_the_queue_orders_by_priority_then_arrival(services: Services, clock: Clock) -> None:
    """High priority waits ahead of normal; equal priority in arrival order."""
    services.borrow(ALICE, BorrowAsk("a100", 8))
    services.borrow(CAROL, BorrowAsk("a100", 6))
    asked = services.borrow("U0DAVE001", BorrowAsk("a100", 2))
    assert isinstance(asked, BorrowResult)
    services.approve(NADIA, asked.request.id)
    first = services.borrow(ERIN, BorrowAsk("a100", 1))
    clock.advance(timedelta(minutes=1))
    second = services.borrow("U0PMGR001", BorrowAsk("a100", 1, priority=Priority.HIGH))
    assert isinstance(first, BorrowResult)
    assert isinstance(second, BorrowResult)
    assert Outcome.QUEUE == first.outcome == second.outcome
    assert [second.request.id, first.request.id] == [r.id for r in services.queue()]


def test_pause_is_for_admins_and_recorded(services: Services) -> None:
    """The kill switch flips only for admins and shows on the home tab."""
    assert isinstance(services.pause(ALICE), Refused)
    assert not services.paused()
    services.pause(ADA)
    assert services.paused()
    assert services.home(ALICE).paused
    services.resume(ADA)
    assert not services.paused()


def test_home_shows_my_leases_requests_and_quota(services: Services) -> None:
    """The App Home brings together what a person holds and waits for."""
    services.borrow(ALICE, BorrowAsk("a100", 2))
    services.borrow(ALICE, BorrowAsk("a100", 8))
    home = services.home(ALICE)
    assert "vision" == home.team
    assert 1 == len(home.leases)
    assert 1 == len(home.requests)
    assert {"a100", "l40s"} == {q.pool for q in home.quotas}
    assert 3 == len(home.pools)
    assert services.home("U0STRANGE").team is None


def test_the_audit_trail_lists_every_row_with_its_hash(services: Services) -> None:
    """audit <id> shows each row of a lease's story, to those allowed."""
    result = services.borrow(ALICE, BorrowAsk("a100", 2))
    assert isinstance(result, BorrowResult)
    assert result.lease is not None
    trail = services.audit(ADA, f"L{result.lease.id}")
    assert isinstance(trail, Explanation)
    assert ["borrow:approved", "lease:granted"] == [line.split()[4] for line in trail.lines]
    assert all("hash=" in line for line in trail.lines)
    assert isinstance(services.audit(CAROL, f"L{result.lease.id}"), Refused)


def test_status_reports_free_gpus_stranded_where_no_waiting_request_fits(
    services: Services,
) -> None:
    """One free L40S left on a node while a 2-GPU request waits: it is stranded."""
    services.borrow(ALICE, BorrowAsk("l40s", 3))
    services.borrow(CAROL, BorrowAsk("l40s", 3))
    asked = services.borrow(BOB, BorrowAsk("l40s", 1))
    assert isinstance(asked, BorrowResult)
    services.approve(ADA, asked.request.id)
    waiting = services.borrow(ERIN, BorrowAsk("l40s", 2))
    assert isinstance(waiting, BorrowResult)
    assert Outcome.QUEUE == waiting.outcome
    l40s = next(p for p in services.status() if p.name == "l40s")
    assert (1, 1, 1) == (l40s.free, l40s.queued, l40s.stranded)
    assert 0 == next(p for p in services.status() if p.name == "a100").stranded
