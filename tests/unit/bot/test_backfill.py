"""Backfill at the use cases: a request further back starts now when it delays no earlier
request's expected start (computed from the leases' end times); `backfill: none` keeps the old
strict order; `best_effort` lets whatever fits start."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from bot.services import BorrowAsk, Services
from bot.services.results import BorrowResult, SettleResult
from rules.domain import Outcome
from storage.db import Database
from tests.builders import sources_with
from tests.unit.bot.conftest import ALICE, BOB, CAROL, ERIN, NADIA, Clock, borrowed

DAVE = "U0DAVE001"
H = timedelta(hours=1)


@pytest.fixture(params=["reserve", "none", "best_effort"])
def backfill(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def services(database: Database, clock: Clock, backfill: str) -> Iterator[Services]:
    sources = sources_with("queue", f"queue: {{backfill: {backfill}}}")
    svc = Services.open(database, sources, clock=clock)
    yield svc
    svc.close()


def vision_waits_for_six(services: Services) -> BorrowResult:
    """a100 (16): Carol holds nlp's 6 for 3h, Dave 4 more on loan for 2h (too young to
    recall), Alice vision's 4 for 8h; 2 free. Alice asks for 4 more inside vision's nominal:
    she waits, expected to start in 2h when Dave's lease ends."""
    borrowed(services, CAROL, BorrowAsk("a100", 6, 3 * H))
    loan = borrowed(services, DAVE, BorrowAsk("a100", 4, 2 * H))
    assert isinstance(services.approve(NADIA, loan.request.id), SettleResult)
    borrowed(services, ALICE, BorrowAsk("a100", 4, 8 * H))
    head = borrowed(services, ALICE, BorrowAsk("a100", 4, 4 * H))
    assert Outcome.QUEUE == head.outcome
    return head


def test_a_short_request_that_ends_before_the_heads_start_goes_first(
    services: Services, backfill: str
) -> None:
    """Erin's 2 GPUs for 1h fit the 2 free ones and end before Alice's expected start:
    granted at once with backfill; behind the head with `none`."""
    vision_waits_for_six(services)
    short = borrowed(services, ERIN, BorrowAsk("a100", 2, H))
    want = Outcome.QUEUE if backfill == "none" else Outcome.APPROVE
    assert want == short.outcome, short.because


def test_the_queue_pass_backfills_too(services: Services, backfill: str) -> None:
    """Nothing is free: Alice's 4 and Bob's 2 for 1h both wait. Erin releases 2: Alice's head
    still lacks 2 (expected in 2h), and Bob's short lease fits before that: the pass grants it,
    unless the queue is strict."""
    borrowed(services, CAROL, BorrowAsk("a100", 6, 3 * H))
    loan = borrowed(services, DAVE, BorrowAsk("a100", 4, 2 * H))
    assert isinstance(services.approve(NADIA, loan.request.id), SettleResult)
    borrowed(services, ALICE, BorrowAsk("a100", 4, 8 * H))
    erin = borrowed(services, ERIN, BorrowAsk("a100", 2, 8 * H))
    head = borrowed(services, ALICE, BorrowAsk("a100", 4, 4 * H))
    short = borrowed(services, BOB, BorrowAsk("a100", 2, H))
    assert Outcome.QUEUE == head.outcome == short.outcome
    assert erin.lease is not None
    services.release(ERIN, erin.lease.id)
    bob = [lease.holder for lease in services.leases(BOB)]
    assert ([] if backfill == "none" else [BOB]) == bob
    assert "queued" == services.request(head.request.id).state  # type: ignore[union-attr]


def test_the_queue_shows_each_heads_expected_start(
    services: Services, clock: Clock, backfill: str
) -> None:
    """Alice's head expects Dave's 4 GPUs at 11:00. Erin's 2 GPUs for 4h fit beside her slot
    (6 come free then, she needs 4), so with backfill Erin starts and Alice's expected start
    does not move."""
    head = vision_waits_for_six(services)
    (entry,) = services.queue_explained()
    assert entry.request.id == head.request.id
    assert clock() + 2 * H == entry.expected_start
    assert entry.for_gpus
    assert "" == entry.head
    borrowed(services, ERIN, BorrowAsk("a100", 2, 4 * H))
    after = services.queue_explained()
    assert clock() + 2 * H == after[0].expected_start
    if backfill == "none":
        assert 2 == len(after)
        assert clock() + 2 * H == after[1].expected_start  # behind Alice, beside her
        assert after[1].waits_for.startswith("this one queues behind 1 waiting request in a100")
    else:
        assert 1 == len(after)
