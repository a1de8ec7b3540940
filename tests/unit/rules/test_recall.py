"""Lender recall as a table: who waits inside its nominal, what is borrowed, who is chosen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rules.policy import Quota, Recall
from rules.recall import Holding, Plan, Waiting, plan

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
RULES = Recall(
    notice=timedelta(minutes=30), min_runtime=timedelta(hours=1), cooldown=timedelta(days=1)
)
# l40s in the shipped rules: 8 GPUs, nominals 3 / 3 / 2.
QUOTAS = {
    "vision": Quota(nominal=3, borrowing_limit=2, lending_limit=3),
    "nlp": Quota(nominal=3, borrowing_limit=2, lending_limit=3),
    "platform": Quota(nominal=2, borrowing_limit=1, lending_limit=2),
}


def held(
    lease: int,
    team: str,
    gpus: int,
    *,
    hours_ago: float = 3,
    priority: str = "normal",
    holder: str | None = None,
    protected: bool = False,
    recalled: bool = False,
    usable: int | None = None,
    within_team: bool = False,
) -> Holding:
    granted = NOW - timedelta(hours=hours_ago)
    return Holding(
        lease=lease,
        holder=holder or f"U{lease:08}",
        team=team,
        gpus=gpus,
        priority=priority,
        granted_at=granted,
        protected=protected,
        recalled_at=NOW - timedelta(minutes=5) if recalled else None,
        recalled_for=10 if recalled else 0,
        usable=usable,
        within_team=within_team,
    )


def planned(
    holdings: list[Holding], queue: list[Waiting], free: int, cooled: tuple[str, ...] = ()
) -> Plan:
    return plan(QUOTAS, holdings, queue, free, now=NOW, recall=RULES, cooled=cooled)


# nlp holds 5 (3 nominal + 2 borrowed in leases 2 and 3), platform 2; 1 GPU free.
NLP_BORROWING = [
    held(1, "nlp", 3, hours_ago=5),
    held(2, "nlp", 1, hours_ago=3),
    held(3, "nlp", 1, hours_ago=2),
    held(4, "platform", 2),
]


def test_a_request_inside_nominal_recalls_the_most_recent_borrowed_lease() -> None:
    """vision asks for 2 of its 3: 1 is free, so 1 more comes back: nlp's newest lease."""
    result = planned(NLP_BORROWING, [Waiting(10, "vision", 2)], free=1)
    assert 1 == result.need
    assert [3] == [v.lease for v in result.start]
    victim = result.start[0]
    assert (10, "vision") == (victim.request, victim.for_team)
    assert "team nlp holds 5 GPUs against a nominal of 3, so 2 are borrowed" in victim.because
    assert (10,) == result.guaranteed
    assert 0 == result.short


def test_lowest_priority_goes_first_then_the_most_recently_granted() -> None:
    holdings = [
        held(1, "nlp", 3, hours_ago=5),
        held(2, "nlp", 1, hours_ago=3, priority="low"),
        held(3, "nlp", 1, hours_ago=2, priority="high"),
        held(4, "platform", 2),
    ]
    result = planned(holdings, [Waiting(10, "vision", 2)], free=1)
    assert [2] == [v.lease for v in result.start]


def test_a_lease_holding_nominal_gpus_too_goes_only_when_nothing_else_covers() -> None:
    """vision needs 3 with nothing free; nlp borrows 2 (leases 2 and 3, its newest) and
    platform 1. Platform's older lease 5 fills its nominal first, so its borrowed GPU is in
    lease 4, which goes too, with a nominal GPU, as nothing else covers the need."""
    holdings = [
        held(1, "nlp", 3, hours_ago=5),
        held(2, "nlp", 1, hours_ago=3),
        held(3, "nlp", 1, hours_ago=2),
        held(4, "platform", 2),
        held(5, "platform", 1, hours_ago=4),  # platform borrows 1 too
    ]
    result = planned(holdings, [Waiting(10, "vision", 3)], free=0)
    assert [3, 2, 4] == [v.lease for v in result.start]
    assert 0 == result.short


PLATFORM = held(4, "platform", 2)  # platform at its nominal: nothing of it is borrowed


@pytest.mark.parametrize(
    ("case", "nlp", "need", "victims", "passed"),
    [
        (
            "a later high-priority lease survives; the earlier low-priority one goes",
            [held(1, "nlp", 3, hours_ago=5, priority="low"), held(2, "nlp", 3, priority="high")],
            2,
            [1],
            [],
        ),
        (
            "equal priorities: the most recently granted goes first",
            [held(1, "nlp", 3, hours_ago=5), held(2, "nlp", 1), held(3, "nlp", 1, hours_ago=2)],
            1,
            [3],
            [],
        ),
        (
            "the nominal covers the high-priority lease granted last; low before normal",
            [
                held(1, "nlp", 1, hours_ago=5, priority="low"),
                held(2, "nlp", 1, hours_ago=4),
                held(3, "nlp", 3, hours_ago=1.5, priority="high"),
            ],
            2,
            [1, 2],
            [],
        ),
        (
            "a lease straddling the nominal goes only after the wholly borrowed ones",
            [
                held(1, "nlp", 2, hours_ago=5),
                held(2, "nlp", 2, priority="high"),
                held(3, "nlp", 1, hours_ago=2, priority="low"),
            ],
            2,
            [3, 1],
            [],
        ),
        (
            "a protected low-priority lease is passed over for the next lowest",
            [
                held(1, "nlp", 1, priority="low", protected=True),
                held(2, "nlp", 1, hours_ago=4),
                held(3, "nlp", 3, priority="high"),
            ],
            1,
            [2],
            [1],
        ),
        (
            "a too young low-priority lease is passed over",
            [
                held(1, "nlp", 1, hours_ago=0.5, priority="low"),
                held(2, "nlp", 1, hours_ago=4),
                held(3, "nlp", 3, priority="high"),
            ],
            1,
            [2],
            [1],
        ),
        (
            "an unhealthy low-priority lease is passed over",
            [
                held(1, "nlp", 1, priority="low", usable=0),
                held(2, "nlp", 1, hours_ago=4),
                held(3, "nlp", 3, priority="high"),
            ],
            1,
            [2],
            [1],
        ),
        (
            "a cooled-down holder's lease is passed over; nothing else is borrowed",
            [held(1, "nlp", 2, holder="U0DAVE001", priority="low"), held(3, "nlp", 3)],
            2,
            [],
            [1],
        ),
    ],
)
def test_victims_are_the_lowest_priority_then_the_most_recent_of_the_borrowed_share(
    case: str, nlp: list[Holding], need: int, victims: list[int], passed: list[int]
) -> None:
    """nlp borrows 2 beyond its nominal 3 of l40s; vision waits for `need` with nothing free.
    The nominal covers nlp's highest-priority leases, so the borrowed share, and the victims,
    are its lowest-priority, most recently granted leases; exempt ones are passed over."""
    result = planned([*nlp, PLATFORM], [Waiting(10, "vision", need)], free=0, cooled=("U0DAVE001",))
    assert victims == [v.lease for v in result.start], case
    assert passed == sorted(result.passed_over), case


@pytest.mark.parametrize(
    ("why", "victim", "expected"),
    [
        ("protected", held(3, "nlp", 1, protected=True), "protected leases are never recalled"),
        ("too young", held(3, "nlp", 1, hours_ago=0.5), "too young to recall for another 30m"),
        ("cooled down", held(3, "nlp", 1, holder="U0DAVE001"), "within the last 1d (cooldown)"),
        ("drained", held(3, "nlp", 1, usable=0), "would not come back usable"),
    ],
)
def test_protected_young_and_recently_preempted_leases_are_passed_over(
    why: str, victim: Holding, expected: str
) -> None:
    """Lease 3 cannot be chosen; lease 2 (also borrowed) is taken instead, and the reason
    lease 3 was passed over is kept for the explanation."""
    holdings = [held(1, "nlp", 3, hours_ago=5), held(2, "nlp", 1, hours_ago=3), victim]
    result = planned(holdings, [Waiting(10, "vision", 2)], free=1, cooled=("U0DAVE001",))
    assert [2] == [v.lease for v in result.start], why
    assert expected in result.passed_over[3]


def test_one_lease_holding_nominal_and_borrowed_gpus_is_recalled_when_nothing_else_will_do() -> (
    None
):
    """nlp took its 3 and 2 borrowed in one lease: that lease goes back, as the lender's
    guarantee comes first; while any other borrowed lease covers the need, it stays."""
    holdings = [held(1, "nlp", 5, hours_ago=5), held(4, "platform", 2)]
    result = planned(holdings, [Waiting(10, "vision", 2)], free=0)
    assert [1] == [v.lease for v in result.start]
    smaller = [*holdings, held(5, "platform", 2, hours_ago=4)]  # platform borrows 2
    result = planned(smaller, [Waiting(10, "vision", 2)], free=0)
    assert [4] == [v.lease for v in result.start]  # the newest platform lease


def test_a_request_beyond_nominal_recalls_nothing() -> None:
    """Borrowing is never a guarantee: vision already holds its 3, and asks for 1 more."""
    holdings = [*NLP_BORROWING, held(5, "vision", 3)]
    result = planned(holdings, [Waiting(10, "vision", 1)], free=0)
    assert () == result.start
    assert () == result.guaranteed


def test_recalls_under_way_stand_while_needed_and_are_withdrawn_when_not() -> None:
    under_way = [
        held(1, "nlp", 3, hours_ago=5),
        held(2, "nlp", 1, hours_ago=3),
        held(3, "nlp", 1, hours_ago=2, recalled=True),
        held(4, "platform", 2),
    ]
    still = planned(under_way, [Waiting(10, "vision", 2)], free=1)
    assert ((3,), (), ()) == (still.keep, still.start, still.withdraw)
    freed = planned(under_way, [Waiting(10, "vision", 2)], free=2)  # someone released one
    assert ((), (), (3,)) == (freed.keep, freed.start, freed.withdraw)
    gone = planned(under_way, [], free=1)  # the request was withdrawn or granted
    assert (3,) == gone.withdraw


def test_guarantees_follow_queue_order_and_add_up_per_team() -> None:
    """Two vision requests of 2 each: only the first fits the team's 3; the second borrows."""
    result = planned(NLP_BORROWING, [Waiting(10, "vision", 2), Waiting(11, "vision", 2)], free=1)
    assert (10,) == result.guaranteed
    assert 1 == result.need


def test_a_teams_nominal_lease_is_never_recalled_in_place_of_its_borrowed_one() -> None:
    """Dave's borrowed lease 2 cannot go (cooldown): Carol's older lease 1 fills nlp's nominal,
    so it is not taken instead, and vision waits."""
    holdings = [held(1, "nlp", 3, hours_ago=5), held(2, "nlp", 2, holder="U0DAVE001")]
    result = planned(holdings, [Waiting(10, "vision", 2)], free=0, cooled=("U0DAVE001",))
    assert () == result.start
    assert 2 == result.short


def test_a_recall_is_withdrawn_once_its_lease_holds_no_borrowed_gpu() -> None:
    """Carol's older nlp lease ended: Dave's lease now fills nlp's nominal, so its recall goes,
    and platform's borrowed lease is recalled instead."""
    holdings = [
        held(2, "nlp", 2, hours_ago=3, recalled=True),
        held(4, "platform", 2, hours_ago=4),
        held(5, "platform", 1, hours_ago=2),
    ]
    result = planned(holdings, [Waiting(10, "vision", 3)], free=2)
    assert ((), (2,)) == (result.keep, result.withdraw)
    assert [5] == [v.lease for v in result.start]


def test_each_recall_is_owed_to_the_request_whose_shortfall_it_covers() -> None:
    """vision's 2 take the free GPU and one recalled; platform's 1 the next recalled one."""
    holdings = [
        held(1, "nlp", 3, hours_ago=5),
        held(2, "nlp", 1, hours_ago=3),
        held(3, "nlp", 1, hours_ago=2),
        held(4, "platform", 1, hours_ago=4),
    ]
    queue = [Waiting(10, "vision", 2), Waiting(11, "platform", 1)]
    result = planned(holdings, queue, free=1)
    assert [(3, 10, "vision"), (2, 11, "platform")] == [
        (v.lease, v.request, v.for_team) for v in result.start
    ]


# Both of nlp's borrowed leases belong to holders preempted within the cooldown: ANN 5h ago,
# BEN 1h ago. Vision's guarantee waits for them.
ANN, BEN = "U0ANN0001", "U0BEN0001"
COOLED = {ANN: NOW - timedelta(hours=5), BEN: NOW - timedelta(hours=1)}


@pytest.mark.parametrize(
    ("case", "holdings", "wanted", "waited", "recalled"),
    [
        (
            "within the bound the cooldown holds",
            [held(2, "nlp", 1, holder=ANN), held(3, "nlp", 1, holder=BEN)],
            1,
            timedelta(minutes=29),
            [],
        ),
        (
            "at the bound the least recently preempted holder goes",
            [held(2, "nlp", 1, holder=BEN), held(3, "nlp", 1, holder=ANN)],
            1,
            timedelta(minutes=30),
            [3],
        ),
        (
            "as many as the guarantee still lacks",
            [held(2, "nlp", 1, holder=ANN), held(3, "nlp", 1, holder=BEN)],
            2,
            timedelta(hours=2),
            [2, 3],
        ),
        (
            "never a protected lease",
            [held(2, "nlp", 1, holder=ANN, protected=True), held(3, "nlp", 1, holder=BEN)],
            1,
            timedelta(hours=2),
            [3],
        ),
        (
            "never a lease younger than the minimum runtime",
            [held(2, "nlp", 1, holder=ANN, hours_ago=0.5), held(3, "nlp", 1, holder=BEN)],
            1,
            timedelta(hours=2),
            [3],
        ),
    ],
)
def test_a_guarantee_waits_no_longer_than_the_bound_for_the_cooldown(
    case: str, holdings: list[Holding], wanted: int, waited: timedelta, recalled: list[int]
) -> None:
    rules = Recall(cooldown=timedelta(days=1), max_guarantee_wait=timedelta(minutes=30))
    result = plan(
        QUOTAS,
        [held(1, "nlp", 3, hours_ago=5), *holdings],
        [Waiting(10, "vision", wanted, waited=waited)],
        0,
        now=NOW,
        recall=rules,
        cooled=COOLED,
    )
    assert recalled == [v.lease for v in result.start], case
    for victim in result.start:
        assert victim.request == 10
        assert victim.because.endswith(
            "R10 of team vision waited "
            f"{'2h' if waited == timedelta(hours=2) else '30m'}, past "
            "recall.max_guarantee_wait (30m); cooldown overridden"
        )
        assert victim.lease not in result.passed_over
    if not recalled:
        assert all("(cooldown)" in why for why in result.passed_over.values())


def test_a_request_beyond_nominal_never_overrides_the_cooldown() -> None:
    holdings = [held(1, "nlp", 3, hours_ago=5), held(2, "nlp", 2, holder=ANN)]
    rules = Recall(max_guarantee_wait=timedelta(minutes=30))
    queue = [Waiting(10, "vision", 4, waited=timedelta(days=1))]  # beyond vision's nominal of 3
    result = plan(QUOTAS, holdings, queue, 0, now=NOW, recall=rules, cooled=COOLED)
    assert result.start == ()


# Preemption within a team: l40s is full, vision holds its nominal 3 in its own leases, nlp and
# platform theirs; nothing is borrowed, so no lender recall can help a vision request.
OTHERS = [held(20, "nlp", 3, hours_ago=6), held(21, "platform", 2, hours_ago=6)]


def within(
    vision: list[Holding],
    queue: list[Waiting],
    free: int = 0,
    cooled: tuple[str, ...] = (),
    *,
    on: bool = True,
) -> Plan:
    return plan(
        QUOTAS,
        [*vision, *OTHERS],
        queue,
        free,
        now=NOW,
        recall=RULES,
        cooled=cooled,
        within_team=on,
    )


def test_within_team_preemption_is_off_by_default() -> None:
    vision = [held(1, "vision", 3, priority="low")]
    result = within(vision, [Waiting(10, "vision", 2, priority="high")], on=False)
    assert ((), (), ()) == (result.start, result.keep, result.withdraw)


def test_a_waiting_request_preempts_a_lower_priority_lease_of_its_own_team() -> None:
    vision = [held(1, "vision", 3, priority="low")]
    result = within(vision, [Waiting(10, "vision", 2, priority="high")])
    (victim,) = result.start
    assert (1, 10, "vision", True) == (
        victim.lease,
        victim.request,
        victim.for_team,
        victim.within_team,
    )
    assert victim.because.startswith(
        "preempted for R10, a high-priority request of your team vision"
    )
    assert () == result.guaranteed  # beyond vision's nominal: no lender recall for it


HIGH = Waiting(10, "vision", 1, priority="high")


@pytest.mark.parametrize(
    ("case", "vision", "waiting", "victims", "passed"),
    [
        (
            "equal priority is never preempted",
            [held(1, "vision", 3, priority="high")],
            HIGH,
            [],
            [],
        ),
        (
            "higher priority is never preempted",
            [held(1, "vision", 3, priority="high")],
            Waiting(10, "vision", 1, priority="normal"),
            [],
            [],
        ),
        (
            "another team's lower-priority lease is never preempted",
            [held(1, "vision", 3, priority="low")],
            Waiting(10, "nlp", 1, priority="normal"),
            [],
            [],
        ),
        (
            "the lowest priority first, then the most recently granted",
            [
                held(1, "vision", 1, priority="normal"),
                held(2, "vision", 1, priority="low", hours_ago=4),
                held(3, "vision", 1, priority="low", hours_ago=2),
            ],
            HIGH,
            [3],
            [],
        ),
        (
            "only what the request needs, not every lower-priority lease",
            [
                held(1, "vision", 1, priority="low", hours_ago=4),
                held(2, "vision", 1, priority="low", hours_ago=3),
                held(3, "vision", 1, priority="low", hours_ago=2),
            ],
            Waiting(10, "vision", 2, priority="high"),
            [3, 2],
            [],
        ),
        (
            "nobody is preempted in vain: what may be taken does not cover the request",
            [
                held(1, "vision", 1, priority="low"),
                held(2, "vision", 2, priority="normal", hours_ago=0.5),
            ],
            Waiting(10, "vision", 2, priority="high"),
            [],
            [2],
        ),
        (
            "a protected lease is passed over",
            [
                held(1, "vision", 1, priority="low", protected=True),
                held(2, "vision", 2, priority="normal", hours_ago=4),
            ],
            HIGH,
            [2],
            [1],
        ),
        (
            "a lease younger than the minimum runtime is passed over",
            [
                held(1, "vision", 1, priority="low", hours_ago=0.5),
                held(2, "vision", 2, priority="normal", hours_ago=4),
            ],
            HIGH,
            [2],
            [1],
        ),
        (
            "a holder within the cooldown is passed over, however long the request waits",
            [
                held(1, "vision", 1, priority="low", holder="U0DAVE001"),
                held(2, "vision", 2, priority="normal", hours_ago=4),
            ],
            Waiting(10, "vision", 1, waited=timedelta(hours=5), priority="high"),
            [2],
            [1],
        ),
    ],
)
def test_within_team_victims_are_of_lower_priority_and_not_exempt(
    case: str, vision: list[Holding], waiting: Waiting, victims: list[int], passed: list[int]
) -> None:
    result = within(vision, [waiting], cooled=("U0DAVE001",))
    assert victims == [v.lease for v in result.start], case
    assert passed == sorted(result.passed_within.get(10, {})), case


def test_free_gpus_and_gpus_coming_back_are_counted_before_preempting() -> None:
    """Two GPUs are free: the high request of 2 needs nothing; of 3 it preempts one lease.
    nlp's borrowed lease is recalled for vision's guarantee first, and what comes back beyond
    that guarantee serves the high request before any vision lease is touched."""
    vision = [held(1, "vision", 1, priority="low"), held(2, "vision", 1, priority="low")]
    assert () == within(vision, [Waiting(10, "vision", 2, priority="high")], free=2).start
    result = within(vision, [Waiting(10, "vision", 3, priority="high")], free=2)
    assert [2] == [v.lease for v in result.start]
    lender = [
        held(1, "vision", 1, priority="low"),
        held(20, "nlp", 3, hours_ago=6),
        held(22, "nlp", 2, hours_ago=2),
        held(21, "platform", 2, hours_ago=6),
    ]
    queue = [Waiting(10, "vision", 1), Waiting(11, "vision", 1, priority="high")]
    result = plan(QUOTAS, lender, queue, 0, now=NOW, recall=RULES, within_team=True)
    assert [(22, False)] == [(v.lease, v.within_team) for v in result.start]


def test_a_recall_within_the_team_stands_while_needed_and_is_withdrawn_when_not() -> None:
    vision = [held(1, "vision", 2, priority="low", recalled=True, within_team=True)]
    high = Waiting(10, "vision", 2, priority="high")
    still = within(vision, [high])
    assert ((1,), (), ()) == (still.keep, still.start, still.withdraw)
    freed = within(vision, [high], free=2)  # GPUs came free another way
    assert ((), (1,)) == (freed.keep, freed.withdraw)
    gone = within(vision, [])  # the request was granted or withdrawn
    assert ((), (1,)) == (gone.keep, gone.withdraw)
    off = within(vision, [high], on=False)  # the setting was turned off
    assert ((), (1,)) == (off.keep, off.withdraw)


def test_a_recall_within_the_team_whose_request_went_stands_for_the_next_that_outranks() -> None:
    vision = [held(1, "vision", 2, priority="low", recalled=True, within_team=True)]
    result = within(vision, [Waiting(11, "vision", 1, priority="normal")])
    assert (1,) == result.keep
    ((lease, request),) = [(v.lease, v.request) for v in result.reassign]
    assert (1, 11) == (lease, request)
    equal = within(vision, [Waiting(11, "vision", 1, priority="low")])
    assert (1,) == equal.withdraw


def test_a_lender_recall_under_way_is_not_taken_for_a_recall_within_the_team() -> None:
    """nlp's borrowed lease 22 is being recalled for vision; nlp's high request then takes
    nlp's normal lease 20, never the one already going back to vision."""
    lender = [
        held(20, "nlp", 3, hours_ago=6),
        held(22, "nlp", 2, hours_ago=2, priority="low", recalled=True),
        held(21, "platform", 2, hours_ago=6),
    ]
    result = plan(
        QUOTAS,
        lender,
        [Waiting(10, "vision", 2), Waiting(11, "nlp", 1, priority="high")],
        0,
        now=NOW,
        recall=RULES,
        within_team=True,
    )
    assert ((22,), ()) == (result.keep, result.reassign)
    assert [(20, 11, True)] == [(v.lease, v.request, v.within_team) for v in result.start]
