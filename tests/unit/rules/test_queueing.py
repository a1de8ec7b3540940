"""The queue's order (per-team queues, guarantees first, fair share, priority, arrival) and
backfill on the pool's timeline (reservations from the leases' end times), table-tested."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from rules.policy import Backfill, Quota
from rules.queueing import DEPTH, Ending, Queued, Timeline, expected_starts, queue_order

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
QUOTAS = {
    "vision": Quota(nominal=3, borrowing_limit=2, lending_limit=3),
    "nlp": Quota(nominal=3, borrowing_limit=2, lending_limit=3),
    "platform": Quota(nominal=2, borrowing_limit=1, lending_limit=2, weight=2.0),
}


def at(minutes: int) -> datetime:
    return NOW + timedelta(minutes=minutes)


def ids(order: list[tuple[Queued, bool]]) -> list[tuple[int, bool]]:
    return [(q.request, inside) for q, inside in order]


def test_the_queue_puts_guarantees_first_then_priority_then_arrival() -> None:
    """nlp holds 5 of its 3: its high-priority request borrows and waits behind vision's low
    ones inside nominal; vision's third request no longer fits its 3 and borrows too."""
    queued = [
        Queued(1, "nlp", 1, "high", at(0)),
        Queued(2, "vision", 2, "low", at(1)),
        Queued(3, "vision", 1, "low", at(2)),
        Queued(4, "vision", 1, "normal", at(3)),
    ]
    order = queue_order(queued, {"nlp": 5}, QUOTAS)
    assert [(4, True), (2, True), (1, False), (3, False)] == ids(order)


def test_borrowers_are_served_by_fair_share_before_priority() -> None:
    """Both teams borrow (each holds its nominal). vision used 30 GPU-h lately, nlp 10: nlp's
    low-priority request goes before vision's high-priority one."""
    queued = [Queued(1, "vision", 1, "high", at(0), H), Queued(2, "nlp", 1, "low", at(1), H)]
    held = {"vision": 3, "nlp": 3}
    assert [2, 1] == [
        q for q, _ in ids(queue_order(queued, held, QUOTAS, {"vision": 30, "nlp": 10}))
    ]
    # without fair share: priority, then arrival
    assert [1, 2] == [q for q, _ in ids(queue_order(queued, held, QUOTAS))]


def test_teams_with_equal_shares_take_turns() -> None:
    """Each request served adds its GPU-hours to its team's usage: vision's three 2 GPU-h
    requests do not all go before nlp's, though they are older."""
    queued = [Queued(n, "vision", 2, "normal", at(n), H) for n in (1, 2, 3)]
    queued += [Queued(n, "nlp", 2, "normal", at(n), H) for n in (4, 5)]
    order = queue_order(queued, {"vision": 3, "nlp": 3}, QUOTAS, {"vision": 0.0, "nlp": 0.1})
    assert [1, 4, 2, 5, 3] == [q for q, _ in ids(order)]


def test_a_heavier_weight_is_owed_more_before_it_yields() -> None:
    """platform (weight 2) used 6 GPU-h, nlp (weight 1) 4: platform's key is 3, nlp's 4."""
    queued = [Queued(1, "nlp", 1, "normal", at(0), H), Queued(2, "platform", 1, "normal", at(1), H)]
    order = queue_order(queued, {"nlp": 3, "platform": 2}, QUOTAS, {"nlp": 4, "platform": 6})
    assert [2, 1] == [q for q, _ in ids(order)]


def test_a_team_keeps_its_own_order_whatever_the_shares() -> None:
    """Within a team: priority, then arrival; fair share orders teams, never a team's own."""
    queued = [
        Queued(1, "vision", 1, "low", at(0), H),
        Queued(2, "vision", 1, "high", at(1), H),
        Queued(3, "nlp", 1, "normal", at(2), H),
    ]
    order = queue_order(queued, {"vision": 3, "nlp": 3}, QUOTAS, {"vision": 0, "nlp": 50})
    assert [2, 1, 3] == [q for q, _ in ids(order)]


def line(free: int, *ending: tuple[int, int]) -> Timeline:
    """A pool with `free` GPUs now and (GPUs, hours from now) coming back."""
    return Timeline(NOW, free, [Ending(g, NOW + h * H) for g, h in ending])


def test_a_request_that_fits_now_and_ends_before_the_heads_start_may_start() -> None:
    """4 free, 4 more back in 2h; the head wants 8: it holds 12:00+2h. A 2-GPU job of 1h ends
    before then: it starts. One of 3h would delay the head: it waits."""
    pool = line(4, (4, 2))
    assert NOW + 2 * H == pool.reserve(1, 8, 6 * H)
    assert [] == pool.delays(2, H)
    assert [1] == pool.delays(2, 3 * H)


def test_a_request_using_gpus_the_head_does_not_need_may_run_long() -> None:
    """6 free, 4 back in 2h; the head wants 8 at 14:00, leaving 2 spare: 2 GPUs for 10h fit."""
    pool = line(6, (4, 2))
    assert NOW + 2 * H == pool.reserve(1, 8, 6 * H)
    assert [] == pool.delays(2, 10 * H)
    assert [1] == pool.delays(3, 10 * H)


def test_a_start_now_is_counted_for_those_after_it() -> None:
    """Two 2-GPU 1h jobs start before the head's slot; then nothing is free for a third, and
    the next 8-GPU slot is after the head's lease (+8h)."""
    pool = line(4, (4, 2))
    pool.reserve(1, 8, 6 * H)
    pool.start(2, H)
    assert [] == pool.delays(2, H)
    pool.start(2, H)
    assert not pool.fits_now(1, H)
    assert [] == pool.delays(1, 3 * H)  # nothing free: it waits, yet delays nobody
    assert NOW + 8 * H == pool.earliest(8, H)


def test_the_earliest_slot_counts_ends_and_earlier_reservations() -> None:
    """8 GPUs: 2 free, 2 back at +1h, 4 back at +3h. R1 wants 4 for 2h (from +1h); R2 wants 6
    for 1h: not before R1's slot ends at +3h."""
    pool = line(2, (2, 1), (4, 3))
    assert NOW + H == pool.reserve(1, 4, 2 * H)
    assert NOW + 3 * H == pool.reserve(2, 6, H)
    assert pool.reserve(3, 9, H) is None  # more than the pool has


@pytest.mark.parametrize(
    ("backfill", "starts"),
    [
        # R1 (8 GPUs) holds +2h; R2 (2 GPUs, 1h) fits now: it waits only for the rules
        (Backfill.RESERVE, {1: 2, 2: None, 3: 8}),
        # strictly in order: R2 and R3 after R1's slot (the pool is full from +2h to +8h)
        (Backfill.NONE, {1: 2, 2: 8, 3: 9}),
        (Backfill.BEST_EFFORT, {1: 2, 2: None, 3: 2}),
    ],
)
def test_expected_starts_by_backfill(backfill: Backfill, starts: dict[int, int | None]) -> None:
    """4 free, 4 back in 2h. R1 wants 8 for 6h, R2 2 for 1h, R3 8 for 1h."""
    waiting = [
        Queued(1, "vision", 8, "normal", at(0), 6 * H),
        Queued(2, "nlp", 2, "normal", at(1), H),
        Queued(3, "nlp", 8, "normal", at(2), H),
    ]
    slots = expected_starts(waiting, line(4, (4, 2)), backfill)
    assert starts == {
        r: (None if s.start is None else int((s.start - NOW) / H)) for r, s in slots.items()
    }
    assert slots[1].for_gpus
    assert slots[2].for_gpus == (backfill == Backfill.NONE)  # else it waits for the rules


def test_a_teams_guarantee_goes_before_its_own_borrowing_request() -> None:
    """vision holds 4 of its 8: its high-priority 8 would borrow, its normal 2 is inside
    nominal. The 2 leads vision's queue, and so comes before nlp's borrower too."""
    queued = [
        Queued(1, "vision", 8, "high", at(0), H),
        Queued(2, "vision", 2, "normal", at(1), H),
        Queued(3, "nlp", 1, "high", at(2), H),
    ]
    quotas = {**QUOTAS, "vision": Quota(nominal=8, borrowing_limit=4, lending_limit=4)}
    order = queue_order(queued, {"vision": 4, "nlp": 3}, quotas, {"vision": 0, "nlp": 50})
    assert [(2, True), (1, False), (3, False)] == ids(order)


def test_a_lease_past_its_end_is_not_free_until_the_sweep_reclaims_it() -> None:
    """2 free, and a 2-GPU lease that should have ended an hour ago: a request for 4 waits
    (for the next sweep at the earliest) and holds that slot, so a long 2-GPU request may
    not take the free ones."""
    pool = Timeline(NOW, 2, [Ending(2, NOW - H)])
    assert not pool.fits_now(4, H)
    assert NOW + timedelta(minutes=1) == pool.reserve(1, 4, H)
    assert [1] == pool.delays(2, 8 * H)


def test_a_request_that_cannot_start_anyway_delays_nobody() -> None:
    """2 free and 1 reserved at +30m: a request for 4 waits for GPUs, not for the reservation
    (the rules then say too few are free, not that others come first)."""
    pool = line(2, (4, 2))
    assert NOW + H / 2 == pool.reserve(1, 1, 150 * timedelta(minutes=1), not_before=NOW + H / 2)
    assert [] == pool.delays(4, H)
    assert [1] == pool.delays(2, H)


def test_backfill_looks_only_so_deep() -> None:
    """Nothing free, one GPU back each hour: the first DEPTH requests waiting for GPUs hold
    slots; those further back are not foreseen: they wait their turn."""
    pool = Timeline(NOW, 0, [Ending(1, NOW + n * H) for n in range(1, 200)])
    waiting = [Queued(n, "vision", 1, "normal", at(n), H) for n in range(DEPTH + 5)]
    slots = expected_starts(waiting, pool, Backfill.RESERVE)
    assert NOW + H == slots[0].start
    assert all(slots[n].start is not None for n in range(DEPTH))
    assert all(slots[n].start is None for n in range(DEPTH, DEPTH + 5))
    assert pool.deep


def walked(pool: Timeline, seed: int) -> list[object]:
    """What a walk of a queue asks of a timeline (starts, reservations, fits, delays, the
    GPUs available at each reservation), answered in order."""
    rng = random.Random(seed)
    said: list[object] = []
    for n in range(60):
        gpus, length = rng.choice((1, 1, 1, 2, 4, 8)), rng.randint(1, 40) * H / 4
        asked = rng.random()
        if asked < 0.1:
            said.append(("start", n, pool.available(NOW)))
            pool.start(gpus, length)
        elif asked < 0.2:
            said.append(("fits", n, pool.fits_now(gpus, length)))
        elif asked < 0.3:
            said.append(("delays", n, pool.delays(gpus, length)))
        elif asked < 0.4:
            said.append(("earliest", n, pool.earliest(gpus, length)))
        else:
            said.append(("reserve", n, pool.reserve(n, gpus, length)))
    said.append([pool.available(r.start) for r in pool.reservations])
    return said


@pytest.mark.parametrize("seed", range(40))
def test_a_timeline_reading_its_ends_as_asked_answers_as_with_every_end(seed: int) -> None:
    """Ends read one at a time, only as far as each question needs, give the answers of a
    timeline holding every end from the start (in groups at the same instant, some past)."""
    rng = random.Random(seed)
    ends = sorted(
        (Ending(rng.choice((0, 1, 1, 2, 4)), NOW + rng.randint(-2, 60) * H / 2) for _ in range(80)),
        key=lambda e: e.at,
    )
    free = rng.choice((0, 0, 1, 3))
    whole = Timeline(NOW, free, ends)
    whole.available(NOW + 1000 * H)  # every end added before any question
    assert walked(whole, seed) == walked(Timeline(NOW, free, iter(ends)), seed)


def test_a_timeline_reads_only_the_ends_its_questions_need() -> None:
    """Nothing free, one GPU back each hour for a thousand hours: three 2-GPU requests
    for an hour each, waiting for GPUs, add the first six ends (each reservation done leaves
    at least 2 GPUs from the last end added on) and look at the seventh; one more GPU for 8
    hours adds it."""
    read: list[Ending] = []

    def one_by_one() -> Iterator[Ending]:
        for n in range(1, 1001):
            read.append(Ending(1, NOW + n * H))
            yield read[-1]

    pool = Timeline(NOW, 0, one_by_one())
    waiting = [Queued(n, "vision", 2, "normal", at(n), H) for n in range(3)]
    assert [NOW + 2 * H, NOW + 3 * H, NOW + 4 * H] == [
        slot.start for slot in expected_starts(waiting, pool, Backfill.RESERVE).values()
    ]
    assert 7 == len(read)
    assert NOW + 3 * H == pool.earliest(1, 8 * H)
    assert 8 == len(read)
