"""Approval routing and who may settle a request, as tables over the shipped rule files."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from rules.approvals import Refusal, approvers_for, check_ask, may_settle, route_for
from tests.builders import default_policy

ADMIN = "U0ADMIN01"
ALICE, BOB = "U0ALICE01", "U0BOB0001"  # vision
ERIN = "U0ERIN001"  # platform
VISION_MANAGER, PLATFORM_MANAGER = "U0VMGR001", "U0PMGR001"


@pytest.mark.parametrize(
    ("team", "who", "approvers", "route"),
    [
        ("vision", "managers", [VISION_MANAGER, ADMIN], "C0VAPPROV"),  # the team's channel
        ("vision", "admins", [ADMIN], "admins"),
        ("platform", "managers", [PLATFORM_MANAGER, ADMIN], "managers"),  # by DM: no channel
        ("platform", "admins", [ADMIN], "admins"),
    ],
)
def test_who_is_asked_and_where_the_card_goes(
    team: str, who: str, approvers: list[str], route: str
) -> None:
    """Managers are asked first, then every admin; admins alone when the rule says so."""
    policy = default_policy()
    assert (approvers, route) == (approvers_for(policy, team, who), route_for(policy, team, who))


def test_an_admin_who_manages_the_team_is_asked_once() -> None:
    """Nobody appears twice among the approvers."""
    policy = default_policy()
    vision = policy.teams["vision"]
    policy = replace(
        policy, teams={**policy.teams, "vision": replace(vision, managers=frozenset({ADMIN}))}
    )
    assert [ADMIN] == approvers_for(policy, "vision", "managers")


@pytest.mark.parametrize(
    ("user", "pool", "gpus", "duration", "code"),
    [
        ("U0STRANGER", "a100", 2, None, "no-team"),
        (ALICE, "tpu", 2, None, "no-pool"),
        (ALICE, "a100", 0, None, "bad-count"),
        (ALICE, "a100", -1, None, "bad-count"),
        (ALICE, "a100", 2, timedelta(0), "bad-duration"),
        (ALICE, "a100", 2, -timedelta(hours=1), "bad-duration"),
        (ALICE, "a100", 2, None, None),  # the pool's default duration applies
        (ALICE, "l40s", 1, timedelta(hours=6), None),
    ],
)
def test_what_no_rule_needs_to_weigh(
    user: str, pool: str, gpus: int, duration: timedelta | None, code: str | None
) -> None:
    """People in no team, unknown pools and impossible counts never reach the rules."""
    refusal = check_ask(default_policy(), user, pool=pool, gpus=gpus, duration=duration)
    assert code == (refusal.code if refusal else None)


def test_an_unknown_pool_is_answered_with_the_pools_there_are() -> None:
    """The refusal names every pool."""
    refusal = check_ask(default_policy(), ALICE, pool="tpu", gpus=1, duration=None)
    expected = "There is no pool called `tpu`. Pools: a100, inference, l40s."
    assert Refusal(expected, "no-pool") == refusal


@pytest.mark.parametrize(
    ("user", "requester", "approvers", "allowed"),
    [
        (VISION_MANAGER, ALICE, [VISION_MANAGER, ADMIN], True),
        (ADMIN, ALICE, [VISION_MANAGER, ADMIN], True),
        (ADMIN, ALICE, [ADMIN], True),  # asked of admins alone
        (VISION_MANAGER, ALICE, [ADMIN], False),  # a manager, but admins alone were asked
        (PLATFORM_MANAGER, ALICE, [VISION_MANAGER, ADMIN], False),  # another team's manager
        (BOB, ALICE, [VISION_MANAGER, ADMIN], False),  # a teammate
        (ALICE, ALICE, [VISION_MANAGER, ADMIN], False),  # the requester
        (ADMIN, ADMIN, [ADMIN], False),  # nobody settles their own request, admins neither
        (ERIN, ALICE, [], False),  # a request nobody was asked to approve
    ],
)
def test_who_may_settle(user: str, requester: str, approvers: list[str], allowed: bool) -> None:
    """Only the people a request was routed to settle it, and never its requester."""
    why = may_settle(user, request_id=12, requester=requester, approvers=approvers)
    assert allowed == (why is None)


@pytest.mark.parametrize(
    ("user", "why"),
    [
        (ALICE, "Nobody approves or denies their own request; a manager or an admin will."),
        (BOB, "You may not approve or deny R12: only its team's managers and the gpubot "
              "admins can."),
    ],
)  # fmt: skip
def test_a_refusal_to_settle_says_why(user: str, why: str) -> None:
    """The requester and a stranger are told different things."""
    assert why == may_settle(user, request_id=12, requester=ALICE, approvers=[VISION_MANAGER])
