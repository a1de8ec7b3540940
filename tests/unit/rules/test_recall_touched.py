"""Recall planned over only the leases it touches, given each team's use: the same plan."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from rules.policy import Quota, Recall
from rules.recall import Holding, Waiting, borrowed_parts, plan, touched

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
RULES = Recall(
    notice=timedelta(minutes=30),
    min_runtime=timedelta(hours=1),
    cooldown=timedelta(days=1),
    max_guarantee_wait=timedelta(hours=6),
)
QUOTAS = {
    "vision": Quota(nominal=12, borrowing_limit=8, lending_limit=12),
    "nlp": Quota(nominal=12, borrowing_limit=8, lending_limit=12),
    "platform": Quota(nominal=6, borrowing_limit=20, lending_limit=6),
}
TEAMS = ("vision", "nlp", "platform", "guests")  # guests: no quota in the pool
PRIORITIES = ("low", "normal", "high")


def a_pool(rng: random.Random) -> tuple[list[Holding], list[Waiting], int, dict[str, datetime]]:
    """Leases of every team (some recalled, protected, young, on drained GPUs), a queue, free
    GPUs and cooled holders, drawn at random."""
    holdings = []
    for lease in range(1, rng.randint(5, 60)):
        recalled = rng.random() < 0.15
        holdings.append(
            Holding(
                lease=lease,
                holder=f"U{rng.randint(1, 12):08}",
                team=rng.choice(TEAMS),
                gpus=rng.randint(1, 4),
                priority=rng.choice(PRIORITIES),
                granted_at=NOW - timedelta(minutes=rng.randint(1, 600)),
                protected=rng.random() < 0.1,
                recalled_at=NOW - timedelta(minutes=rng.randint(1, 60)) if recalled else None,
                recalled_for=rng.randint(100, 130) if recalled else 0,
                usable=rng.choice((None, None, None, 0, 1)),
                within_team=recalled and rng.random() < 0.3,
            )
        )
    queue = [
        Waiting(
            100 + k,
            rng.choice(TEAMS),
            rng.randint(1, 4),
            waited=timedelta(minutes=rng.randint(0, 900)),
            priority=rng.choice(PRIORITIES),
        )
        for k in range(rng.randint(0, 30))
    ]
    cooled = {
        f"U{rng.randint(1, 12):08}": NOW - timedelta(hours=rng.randint(1, 20))
        for _ in range(rng.randint(0, 4))
    }
    return holdings, queue, rng.randint(0, 6), cooled


@pytest.mark.parametrize("within_team", [False, True])
@pytest.mark.parametrize("seed", range(60))
def test_the_plan_over_the_touched_leases_is_the_plan_over_all_of_them(
    seed: int, within_team: bool
) -> None:
    """Given each team's use, leaving out the leases of teams at or below their nominal that
    are not being recalled changes nothing in the plan (without preemption within a team)."""
    holdings, queue, free, cooled = a_pool(random.Random(seed))
    used: dict[str, int] = {}
    for h in holdings:
        used[h.team] = used.get(h.team, 0) + h.gpus
    some = [h for h in holdings if touched(h, used, QUOTAS, within_team)]
    kwargs = {"now": NOW, "recall": RULES, "cooled": cooled, "within_team": within_team}
    expected = plan(QUOTAS, holdings, queue, free, **kwargs)  # type: ignore[arg-type]
    actual = plan(QUOTAS, some, queue, free, used=used, **kwargs)  # type: ignore[arg-type]
    assert expected == actual
    if within_team:
        assert holdings == some


def test_a_team_at_its_nominal_is_not_touched_unless_recalled() -> None:
    """vision holds exactly its nominal: its leases hold nothing borrowed; platform is above."""
    lease = Holding(1, "U1", "vision", 12, "normal", NOW, False)
    used = {"vision": 12, "platform": 7}
    assert not touched(lease, used, QUOTAS, False)
    assert touched(Holding(2, "U2", "platform", 7, "normal", NOW, False), used, QUOTAS, False)
    assert touched(
        Holding(3, "U3", "vision", 1, "normal", NOW, False, recalled_at=NOW), used, QUOTAS, False
    )
    assert touched(lease, used, QUOTAS, True)


def holding_borrowed(holdings: list[Holding], used: dict[str, int]) -> list[Holding]:
    """Of each team above its nominal, its leases from the lowest priority, the most recently
    granted first, until their GPUs reach those beyond its nominal (as the pool's storage
    reads them)."""
    order = {p: n for n, p in enumerate(PRIORITIES)}
    out = []
    for team, gpus in used.items():
        quota = QUOTAS.get(team)
        beyond = gpus - (quota.nominal if quota else 0)
        mine = [h for h in holdings if h.team == team]
        for h in sorted(
            mine, key=lambda h: (order[h.priority], -h.granted_at.timestamp(), -h.lease)
        ):
            if beyond <= 0:
                break
            out.append(h)
            beyond -= h.gpus
    return out


@pytest.mark.parametrize("seed", range(60))
def test_the_plan_over_the_leases_holding_borrowed_gpus_is_the_plan_over_all(seed: int) -> None:
    """Given each team's use, the leases holding borrowed GPUs, those being recalled and some
    others (leases coming back soon) plan as every lease does; the borrowed GPUs of each are
    those the whole pool gives it, and the others hold none."""
    rng = random.Random(seed)
    holdings, queue, free, cooled = a_pool(rng)
    used: dict[str, int] = {}
    for h in holdings:
        used[h.team] = used.get(h.team, 0) + h.gpus
    tail = holding_borrowed(holdings, used)
    some = [h for h in holdings if h in tail or h.recalled_at is not None or rng.random() < 0.2]
    kwargs = {"now": NOW, "recall": RULES, "cooled": cooled, "within_team": False}
    expected = plan(QUOTAS, holdings, queue, free, **kwargs)  # type: ignore[arg-type]
    actual = plan(QUOTAS, some, queue, free, used=used, **kwargs)  # type: ignore[arg-type]
    assert expected == actual
    whole = borrowed_parts(holdings, QUOTAS)
    part = borrowed_parts(some, QUOTAS, used)
    assert {h.lease: whole[h.lease] for h in some} == part
    assert all(whole[h.lease] == 0 for h in some if h not in tail)
