"""The story from the README in a real browser: a researcher borrows over quota, the manager
approves with the button, the DM says where to run, the clock moves on, the expiry warning
arrives, and Extend works (over quota, the manager agrees to the extension too)."""

from __future__ import annotations

import re
from datetime import timedelta
from zoneinfo import ZoneInfo

from playwright.sync_api import expect

from tests.browser.workspace import ALICE, GPU, VICTOR, VISION_APPROVALS, SlackPage


def test_a_borrow_over_quota_is_approved_with_the_button_then_warned_and_extended(
    slack: SlackPage,
) -> None:
    """Ask, approve, DM with CUDA_VISIBLE_DEVICES; an hour later the warning, Extend 2h, and
    the manager's second Approve moves the end."""
    slack.open(ALICE, GPU)
    slack.send("/gpu borrow 4 a100 for 2h because ablations")
    asked = slack.message("needs approval")
    # 👁 where the host has an emoji font; without one the page draws no box in its place
    expect(asked.locator(".only-you")).to_have_text(re.compile(r"^(👁 )?\s*Only visible to you$"))

    slack.act_as(VICTOR)
    slack.go(VISION_APPROVALS)
    card = slack.message("GPU request")
    expect(card).to_contain_text("@Alice Anders")
    expect(card).to_contain_text("ablations")
    slack.screenshot("demo-approval")
    slack.click(card, "Approve")
    expect(card).to_contain_text("Approved by Victor Vision")
    expect(card.locator(".edited")).to_have_text("(edited)")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)

    slack.act_as(ALICE)
    slack.go("dm")
    lease = slack.demo.bot.services.leases(ALICE)[0]
    # Dave's and Carol's work without a lease keeps their GPUs out of every grant.
    assert ("a100-node-02", 6) not in {(g.node, g.index) for g in lease.gpus}
    granted = slack.message(f"Your GPUs are ready: {lease.code}")
    expect(granted).to_contain_text("CUDA_VISIBLE_DEVICES=")
    # <!date^…> in the reader's zone (Berlin here), the UTC text only as its fallback title
    until = granted.locator("time.date").first
    expect(until).to_contain_text(
        f"{lease.expires_at.astimezone(ZoneInfo('Europe/Berlin')):%-I:%M}"
    )
    expect(until).to_have_attribute("title", lease.expires_at.strftime("%Y-%m-%d %H:%M UTC"))

    slack.forward("1 hour")
    warning = slack.message(f"{lease.code} ends soon")
    expect(warning).to_contain_text("Nothing is taken before")
    slack.screenshot("demo-dm")
    slack.click(warning, "Extend 2h")
    asked = slack.message(f"to extend {lease.code} by 2h")
    expect(asked.locator(".only-you")).to_be_visible()

    slack.act_as(VICTOR)
    slack.go(VISION_APPROVALS)
    extension = slack.message("Extension request")
    slack.click(extension, "Approve")
    expect(extension).to_contain_text("Approved by Victor Vision")

    slack.act_as(ALICE)
    slack.go("dm")
    slack.message("Victor Vision approved")
    later = slack.demo.bot.services.lease(lease.id)
    assert later is not None
    assert lease.expires_at + timedelta(hours=2) == later.expires_at
    services = slack.demo.bot.services
    assert [] == services.intrusions()  # no leased GPU runs anyone else's work
    assert {"a100-node-02:6 by dave", "l40s-node-01:2 by carol"} <= set(services.unreserved())
