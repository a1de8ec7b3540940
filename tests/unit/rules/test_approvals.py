"""Approval routing and who may settle a request, as tables over the shipped rule files."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from rules.approvals import (
    Refusal,
    approvers_for,
    check_ask,
    check_form,
    escalation_settlers,
    may_settle,
    most_gpus,
    pools_for,
    route_for,
)
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


@pytest.mark.parametrize(
    ("user", "approvers", "why"),
    [
        (BOB, [VISION_MANAGER, ADMIN], "You may not approve or deny R12: you are not a manager "
         "of vision, so you cannot approve this. Only vision's managers and the gpubot admins "
         "can."),
        (VISION_MANAGER, [ADMIN], "You may not approve or deny R12: it was sent to the gpubot "
         "admins, so even a manager of vision cannot approve this."),
    ],
)  # fmt: skip
def test_a_refusal_names_the_team_the_clicker_does_not_manage(
    user: str, approvers: list[str], why: str
) -> None:
    """Bob is told he is not a vision manager; Victor that admins alone were asked."""
    team = default_policy().teams["vision"]
    assert why == may_settle(
        user, request_id=12, requester=ALICE, approvers=approvers, team=team, admins=[ADMIN]
    )


def test_a_refusal_names_the_people_a_request_was_escalated_to() -> None:
    """Escalated to Erin too: Bob is told she may, besides the managers and the admins."""
    team = default_policy().teams["vision"]
    why = may_settle(
        BOB,
        request_id=12,
        requester=ALICE,
        approvers=[VISION_MANAGER, ADMIN, ERIN],
        team=team,
        admins=[ADMIN],
    )
    assert why is not None
    assert why.endswith(f"Only vision's managers, the gpubot admins and <@{ERIN}> can.")


@pytest.mark.parametrize(
    ("targets", "settlers"),
    [
        ([ADMIN], [ADMIN]),
        ([ERIN], [ERIN]),
        (["C0ESCAL01"], [ADMIN]),  # nobody is known to read a channel: the admins settle there
        ([ERIN, "C0ESCAL01"], [ERIN, ADMIN]),
        ([ADMIN, "C0ESCAL01"], [ADMIN]),
    ],
)
def test_who_may_settle_an_escalated_request(targets: list[str], settlers: list[str]) -> None:
    """The people escalated to, and the admins when a channel is among the targets."""
    assert settlers == escalation_settlers(default_policy(), targets)


HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("user", "pool", "gpus", "duration", "reason", "expected"),
    [
        (ALICE, "a100", 2, 6 * HOUR, "ablations", {}),
        (ALICE, "a100", None, None, "ablations", {}),  # the count was answered already
        (ALICE, "a100", 0, None, "x", {"count": "Ask for at least one GPU."}),
        (
            ALICE,
            "a100",
            100,
            None,
            "x",
            {"count": "One request of team vision in a100 may take at most 8 GPUs."},
        ),
        (
            ALICE,
            "inference",
            1,
            None,
            "x",
            {"pool": "Team vision has no quota in inference. Its pools: a100, l40s."},
        ),
        (
            ALICE,
            "a100",
            1,
            99 * 24 * HOUR,
            "x",
            {"duration": "A borrow in a100 lasts at most 3d; ask for less."},
        ),
        (
            ALICE,
            "a100",
            1,
            -HOUR,
            "x",
            {"duration": "Ask for some time to come: 6h, or an end still ahead."},
        ),
        (
            ALICE,
            "a100",
            1,
            None,
            " ",
            {"reason": "Say in a few words what the GPUs are for: your manager may read it."},
        ),
        (
            ALICE,
            "a100",
            1,
            None,
            "x" * 501,
            {"reason": "At most 500 characters, please (yours has 501)."},
        ),
        (
            ERIN,
            "inference",
            5,
            None,
            "serving",
            {"count": "One request of team platform in inference may take at most 4 GPUs."},
        ),
    ],
)
def test_the_borrow_form_is_checked_by_field_against_the_hard_limits(  # noqa: PLR0917 - a column per field
    user: str,
    pool: str,
    gpus: int | None,
    duration: timedelta | None,
    reason: str,
    expected: dict[str, str],
) -> None:
    """Each field's problem under its own name, before anything is filed."""
    got = check_form(default_policy(), user, pool=pool, gpus=gpus, duration=duration, reason=reason)
    assert expected == got


def test_the_form_offers_only_the_pools_a_team_may_use() -> None:
    """Vision has no quota in inference; platform has quota in all three."""
    policy = default_policy()
    assert ["a100", "l40s"] == pools_for(policy, policy.teams["vision"])
    assert ["a100", "inference", "l40s"] == pools_for(policy, policy.teams["platform"])
    assert [] == pools_for(policy, None)
    assert (8, 5) == (most_gpus(policy, "vision", "a100"), most_gpus(policy, "vision", "l40s"))


def test_a_reason_too_long_to_read_is_refused_before_the_rules() -> None:
    """The slash command's friendly error names the limit and the length given."""
    refusal = check_ask(
        default_policy(), ALICE, pool="a100", gpus=1, duration=None, reason="y" * 600
    )
    assert refusal is not None
    assert "long-reason" == refusal.code
    assert "500 characters (yours has 600)" in refusal.message
