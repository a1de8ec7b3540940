"""The Home tab by role: what each sees, the buttons it carries, and Slack's limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bot.services.results import Fleet, TeamWork, UnreservedGpu, WeekUse
from bot.slack.blocks import APPROVE_ACTION, DENY_ACTION, home_view
from bot.slack.blocks.home import NO_TEAM, PAUSE_ACTION, RESUME_ACTION, week_line
from rules.reports import Usage
from tests.unit.slack.builders import (
    ALICE,
    BOB,
    a_home,
    a_lease,
    a_pool,
    a_request,
    assert_within_limits,
    texts_of,
)

ADA = "U0ADMIN01"
H = 3600.0
FLEET = Fleet(
    drained=("l40s-node-02",),
    silent=("a100-node-02",),
    unreserved=(UnreservedGpu("a100-node-01", 3, "a100", ("carol",)),),
    queue=(a_request(id=9, state="queued"),),
)


def a_manager_home(**overrides: Any) -> dict[str, Any]:
    asked = tuple(a_request(id=n, requester=BOB, state="pending") for n in (4, 5))
    team = TeamWork("vision", (a_lease(holder=ALICE),), asked)
    return home_view(a_home(waiting=asked, managed=(team,), **overrides))


def an_admin_home(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "user": ADA,
        "team": None,
        "leases": (),
        "requests": (),
        "quotas": (),
        "admin": True,
        "fleet": FLEET,
        "pools": (a_pool(), a_pool(name="l40s")),
    }
    return home_view(a_home(**{**fields, **overrides}))


def elements(view: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in view["blocks"]:
        out += block.get("elements", []) if block["type"] == "actions" else []
        out += [block["accessory"]] if "accessory" in block else []
    return out


VIEWS: dict[str, Callable[[], dict[str, Any]]] = {
    "researcher": lambda: home_view(
        a_home(
            requests=(a_request(id=3, state="queued"),),
            places={3: 2},
            week=WeekUse(Usage(12 * H, 6 * H, 7.5 * H, 2.5 * H, 2 * H, cost=28.8), "USD", True),
        )
    ),
    "manager": a_manager_home,
    "manager, 40 waiting": lambda: home_view(
        a_home(waiting=tuple(a_request(id=n, requester=BOB) for n in range(40)))
    ),
    "admin": an_admin_home,
    "admin, paused": lambda: an_admin_home(paused=True),
}


@pytest.mark.parametrize("build", VIEWS.values(), ids=VIEWS.keys())
def test_every_role_home_validates_and_stays_within_slack_limits(
    build: Callable[[], dict[str, Any]],
) -> None:
    """100 blocks, unique block ids, slack_sdk's validators, for every role."""
    assert_within_limits(build())


def test_a_researcher_sees_the_place_of_a_queued_request_and_the_week() -> None:
    """Second in the queue; GPU-hours held and busy."""
    text = texts_of(VIEWS["researcher"]())
    assert "2nd in the *a100* queue." in text
    assert (
        "Last 7 days: you held 12.0 GPU-hours, 50 % efficiency (6.0 GPU-h used), 2.5 GPU-h "
        "idle, 2.0 GPU-h with no readings; cost 28.80 USD."
    ) in text
    assert "Waiting for you" not in text
    assert "Last 7 days: you held no GPUs." == week_line(WeekUse(Usage()))
    unseen = WeekUse(Usage(3 * H, unknown_s=3 * H))  # no reading, no price
    assert "Last 7 days: you held 3.0 GPU-hours, 3.0 GPU-h with no readings." == week_line(unseen)


def test_a_manager_approves_from_home_with_the_cards_own_buttons() -> None:
    """Approve / Deny carry the approval card's action ids and the request id as value."""
    view = a_manager_home()
    text = texts_of(view)
    assert "Team vision: leases and requests" in str(view)
    assert "<@U0ALICE01>" in text
    buttons = [(e["action_id"], e["value"]) for e in elements(view)]
    for request in ("4", "5"):
        assert (APPROVE_ACTION, request) in buttons
        assert (DENY_ACTION, request) in buttons


def test_an_admin_sees_the_fleet_and_a_pause_switch_never_ask_an_admin() -> None:
    """The fleet, drained and silent nodes, unreserved use, the queue; Pause is red and asks
    first; an admin in no team is never told to ask an admin."""
    view = an_admin_home()
    text = texts_of(view)
    assert "Ask an admin to add you" not in text
    for part in ("l40s-node-02", "a100-node-02", "a100-node-01` GPU 3", "carol", "*R9*"):
        assert part in text
    assert "0 drained" in text
    switch = next(e for e in elements(view) if e["action_id"] == PAUSE_ACTION)
    assert "danger" == switch["style"]
    assert "Pause automation?" == switch["confirm"]["title"]["text"]
    paused = an_admin_home(paused=True)
    assert [RESUME_ACTION] == [
        e["action_id"] for e in elements(paused) if e["action_id"] in (PAUSE_ACTION, RESUME_ACTION)
    ]


def test_a_person_in_no_team_who_is_not_an_admin_is_told_to_ask_one() -> None:
    """The one Home that says "Ask an admin to add you", and no pause switch."""
    view = home_view(a_home(team=None, quotas=()))
    assert NO_TEAM in texts_of(view)
    assert PAUSE_ACTION not in str(view)
