"""Role Home tabs through signed HTTP and the local Slack API: what views.publish received for
each role, Approve from a manager's Home, Homes redrawn after a submit, a click and a grant, the
pause switch, and drain and resume answered in words."""

from __future__ import annotations

import json
from typing import Any

from sqlmodel import select

from bot.services.homes import HOME_EVERY
from storage.tables import LeaseRow
from tests.integration.conftest import Running
from tests.integration.test_flows import answered, card, dm_text

ALICE, BOB, VICTOR, ADA = "U0ALICE01", "U0BOB0001", "U0VMGR001", "U0ADMIN01"


def home_of(running: Running, user: str) -> dict[str, Any]:
    """The Home last published for `user`, opened first as a person would."""
    running.slack.open_home(user)
    running.deliver()
    home = running.local.home(user)
    assert home is not None
    return home


def deliver_later(running: Running) -> None:
    """Deliver with the outbox's clock past HOME_EVERY: others' Homes are due too."""
    running.bot.deliverer.clock = lambda: running.bot.services.now() + 2 * HOME_EVERY
    running.deliver()


def published_for(running: Running, user: str) -> list[str]:
    """Every Home view published for `user`, as JSON text, oldest first."""
    calls = running.local.calls.of("views.publish")
    return [
        json.dumps(c.args["view"], ensure_ascii=False) for c in calls if c.args["user_id"] == user
    ]


def test_a_manager_approves_from_home_and_the_card_and_homes_are_redrawn(
    running: Running,
) -> None:
    """Bob's request waits for Victor; Approve on Victor's Home settles it like the card, the
    card loses its buttons, Bob's Home shows the lease, and Victor's no longer waits."""
    answered(running, ALICE, "borrow 8 a100 for 6h because full")
    answered(running, BOB, "borrow 2 a100 for 2h because more")
    running.deliver()
    posted = card(running)
    home = home_of(running, VICTOR)
    shown = json.dumps(home)
    assert "Waiting for you" in shown
    assert "Team vision: leases and requests" in shown
    running.slack.click(VICTOR, home, "request_approve", block_id="waiting:2")
    running.deliver()
    assert "Waiting for you" not in published_for(running, VICTOR)[-1]  # his, at once
    deliver_later(running)
    with running.bot.db.read() as session:
        assert 1 == len(session.exec(select(LeaseRow).where(LeaseRow.holder == BOB)).all())
    updates = [c for c in running.local.calls.of("chat.update") if c.args["ts"] == posted.ts]
    assert updates
    assert "request_approve" not in json.dumps(updates[-1].args["blocks"])
    assert "*L2*" in published_for(running, BOB)[-1]
    assert "approved" in dm_text(running, VICTOR)


def test_a_form_submit_redraws_the_home_without_it_being_opened(running: Running) -> None:
    """The borrow form granted: Alice's Home is published with her lease, unasked."""
    running.slack.command(ALICE, "borrow")
    view = running.local.wait_for("views.open").response["view"]
    values = {"pool": "l40s", "count": "1", "duration": "2h", "priority": "normal", "reason": "x"}
    assert 200 == running.slack.submit(ALICE, view, values).status
    running.deliver()
    assert published_for(running, ALICE)
    assert "*L1*" in published_for(running, ALICE)[-1]
    assert "Last 7 days" in published_for(running, ALICE)[-1]
    deliver_later(running)
    assert "*l40s* · 8 GPUs: 1 leased" in published_for(running, ADA)[-1]  # the fleet moved


def test_an_admin_in_no_team_sees_the_fleet_and_pauses_from_home(running: Running) -> None:
    """Ada's Home: the fleet and a red Pause, never "Ask an admin"; Pause asks first, answers
    by DM, and the Home comes back with Resume."""
    home = home_of(running, ADA)
    shown = json.dumps(home)
    assert "Fleet" in shown
    assert "Ask an admin to add you" not in shown
    assert '"style": "danger"' in shown
    running.slack.click(ADA, home, "automation_pause")
    running.deliver()
    assert "Automation is paused" in dm_text(running, ADA)
    assert running.bot.services.paused()
    latest = published_for(running, ADA)[-1]
    assert "automation_resume" in latest
    assert "automation_pause" not in latest


def test_drain_names_the_holders_and_tells_them_and_resume_says_already_running(
    running: Running,
) -> None:
    """The drain's answer names Alice's lease; Alice's DM says what happens to it and why;
    resume while running says so."""
    answered(running, ALICE, "borrow 2 a100 for 6h because ablations")
    running.deliver()
    lease = running.bot.services.lease(1)
    assert lease is not None
    name = lease.gpus[0].node
    reply = answered(running, ADA, f"admin drain {name} because fan swap")
    text = json.dumps(reply.args)
    assert "L1 of <@U0ALICE01>" in text
    running.deliver()
    assert f"drained `{name}` (fan swap), where L1 runs" in dm_text(running, ALICE)
    again = answered(running, ADA, "admin resume")
    assert "Automation is already running." in json.dumps(again.args)
