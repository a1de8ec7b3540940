"""Fair share as tables: how past GPU-hours decay, and each team's share and key, with numbers
worked by hand."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from rules.fairshare import Interval, Share, decayed_usage, shares
from rules.policy import Quota

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
WEEK = timedelta(days=7)
HOUR = timedelta(hours=1)
LN2 = math.log(2)


def ago(delta: timedelta) -> datetime:
    return NOW - delta


@pytest.mark.parametrize(
    ("intervals", "half_life", "expected"),
    [
        # 1 GPU for the hour that ended one half-life ago: that hour counts half
        # (integrated: 168/ln2 * (2**-1 - 2**-(1 + 1/168)) GPU-h, 0.49897)
        ([Interval("nlp", 1, ago(WEEK + HOUR), ago(WEEK))], WEEK, {"nlp": 0.49897}),
        # a whole half-life of 4 GPUs that ended one half-life ago: 4 * 168h/ln2 * (1/2 - 1/4)
        ([Interval("nlp", 4, ago(2 * WEEK), ago(WEEK))], WEEK, {"nlp": 168 / LN2}),
        # a running lease of 2 GPUs granted one half-life ago: 2 * 1h/ln2 * (1 - 1/2)
        ([Interval("vision", 2, ago(HOUR), None)], HOUR, {"vision": 1 / LN2}),
        # the same, recorded as ending in the future: counted up to now only
        ([Interval("vision", 2, ago(HOUR), NOW + HOUR)], HOUR, {"vision": 1 / LN2}),
        # two leases of one team add up; a lease not yet begun counts nothing
        (
            [
                Interval("vision", 2, ago(HOUR), None),
                Interval("vision", 2, ago(2 * HOUR), ago(HOUR)),
                Interval("nlp", 8, NOW + HOUR, None),
            ],
            HOUR,
            {"vision": 1 / LN2 + 0.5 / LN2, "nlp": 0.0},
        ),
        # a long half-life: an hour just ended counts almost in full
        ([Interval("nlp", 3, ago(HOUR), NOW)], timedelta(days=365), {"nlp": 2.99988}),
        # a zero half-life: fair share is off
        ([Interval("nlp", 4, ago(WEEK), None)], timedelta(0), {}),
        # nothing used
        ([], WEEK, {}),
    ],
)
def test_usage_decays_by_half_every_half_life(
    intervals: list[Interval], half_life: timedelta, expected: dict[str, float]
) -> None:
    assert expected == pytest.approx(decayed_usage(intervals, NOW, half_life), abs=1e-5)


def test_a_lease_held_for_ever_counts_half_life_over_ln2_per_gpu() -> None:
    """The weights of all past hours add up to half_life / ln 2: a bounded memory."""
    forever = Interval("nlp", 1, ago(100 * WEEK), None)
    assert 168 / LN2 == pytest.approx(decayed_usage([forever], NOW, WEEK)["nlp"])


TWO_TO_ONE = {
    "vision": Quota(nominal=8, borrowing_limit=4, lending_limit=4, weight=2),
    "nlp": Quota(nominal=6, borrowing_limit=4, lending_limit=4, weight=1),
}


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # weights 2:1, equal use: vision used half while owed two thirds, so it goes first
        (
            {"vision": 30.0, "nlp": 30.0},
            {
                "vision": Share("vision", 2, 2 / 3, 30.0, 0.5),
                "nlp": Share("nlp", 1, 1 / 3, 30.0, 0.5),
            },
        ),
        # use in proportion to the weights: both keys are 1
        (
            {"vision": 40.0, "nlp": 20.0},
            {
                "vision": Share("vision", 2, 2 / 3, 40.0, 2 / 3),
                "nlp": Share("nlp", 1, 1 / 3, 20.0, 1 / 3),
            },
        ),
        # nobody used anything: every usage share and key is 0
        (
            {},
            {
                "vision": Share("vision", 2, 2 / 3, 0.0, 0.0),
                "nlp": Share("nlp", 1, 1 / 3, 0.0, 0.0),
            },
        ),
        # a team without a quota in the pool is neither shown nor counted in the total
        (
            {"nlp": 10.0, "robots": 90.0},
            {
                "vision": Share("vision", 2, 2 / 3, 0.0, 0.0),
                "nlp": Share("nlp", 1, 1 / 3, 10.0, 1.0),
            },
        ),
    ],
)
def test_each_team_with_a_quota_gets_its_share(
    usage: dict[str, float], expected: dict[str, Share]
) -> None:
    assert expected == shares(TWO_TO_ONE, usage)


@pytest.mark.parametrize(
    ("usage", "keys"),
    [
        ({"vision": 30.0, "nlp": 30.0}, {"vision": 0.75, "nlp": 1.5}),
        ({"vision": 40.0, "nlp": 20.0}, {"vision": 1.0, "nlp": 1.0}),
        ({"vision": 60.0}, {"vision": 1.5, "nlp": 0.0}),
        ({}, {"vision": 0.0, "nlp": 0.0}),
    ],
)
def test_the_key_is_usage_share_over_weight_share(
    usage: dict[str, float], keys: dict[str, float]
) -> None:
    """Lower goes first: a team that used less than it is owed."""
    got = {team: share.key for team, share in shares(TWO_TO_ONE, usage).items()}
    assert keys == pytest.approx(got)


def test_a_pool_without_quotas_has_no_shares() -> None:
    assert {} == shares({}, {"nlp": 3.0})
