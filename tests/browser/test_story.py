"""The story from the README in a real browser: a researcher borrows over quota, the manager
approves with the button, the DM says where to run, the clock moves on, the expiry warning
arrives in the lease's thread, and Extend works (over quota, the manager agrees to the extension
too, from "Waiting for you" on his Home); a 4-GPU lease that runs on one GPU is warned and gives
the idle three back."""

from __future__ import annotations

import re
from datetime import timedelta
from zoneinfo import ZoneInfo

from playwright.sync_api import expect

from bot.services.results import LeaseView
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
    expect(asked.get_by_role("button", name="Remind approvers")).to_be_visible()

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
    slack.click(warning, "Extend 2h")
    asked = slack.message(f"to extend {lease.code} by 2h")
    expect(asked.locator(".only-you")).to_be_visible()

    approve_from_home(slack)
    later = slack.demo.bot.services.lease(lease.id)
    assert later is not None
    assert lease.expires_at + timedelta(hours=2) == later.expires_at
    read_the_thread(slack, later)
    services = slack.demo.bot.services
    assert [] == services.intrusions()  # no leased GPU runs anyone else's work
    assert {"a100-node-02:6 by dave", "l40s-node-01:2 by carol"} <= set(services.unreserved())


def approve_from_home(slack: SlackPage) -> None:
    """Victor's Home lists what waits for him, with the card's own buttons; Approve there."""
    slack.act_as(VICTOR)
    slack.go("home")
    home = slack.page.locator("#home")
    expect(home).to_contain_text("Waiting for you")
    expect(home.get_by_role("button", name="Approve", exact=True)).to_have_count(1)
    slack.screenshot("demo-manager-home")
    slack.click(home, "Approve")
    expect(home).not_to_contain_text("Waiting for you")
    slack.go(VISION_APPROVALS)
    expect(slack.message("Extension request")).to_contain_text("Approved by Victor Vision")


def read_the_thread(slack: SlackPage, lease: LeaseView) -> None:
    """The grant DM is the lease's home: the warning and the extension are replies in its
    thread, and the grant itself is redrawn with the new end."""
    slack.act_as(ALICE)
    slack.go("dm")
    granted = slack.message(f"Your GPUs are ready: {lease.code}")
    expect(granted.locator(".replies")).to_contain_text(re.compile(r"\d+ replies"))
    thread = slack.thread(granted)
    expect(thread.locator(".message", has_text=f"{lease.code} ends soon")).to_have_count(1)
    expect(thread).to_contain_text("Victor Vision approved")
    expect(granted.locator("time.date").first).to_contain_text(
        f"{lease.expires_at.astimezone(ZoneInfo('Europe/Berlin')):%-I:%M}"
    )
    slack.screenshot("demo-thread")


def test_reserve_four_run_on_one_then_give_back_the_idle_gpus(slack: SlackPage) -> None:
    """Alice's training holds a100-node-01 GPUs 0-3 and runs on GPU 0 alone after 20 minutes:
    the partly-idle warning arrives in the lease's thread, and Give back leaves a 1-GPU lease."""
    slack.open(ALICE, "dm")
    services = slack.demo.bot.services
    training = next(lease for lease in services.leases(ALICE) if len(lease.gpus) == 4)
    slack.forward("1 hour")
    slack.forward("1 hour")
    granted = slack.message(f"Your GPUs are ready: {training.code}")
    thread = slack.thread(granted)
    warning = thread.locator(".message", has_text="3 of your 4 GPUs")
    expect(warning).to_contain_text("idle")
    slack.click(warning, "Give back the 3 idle GPUs")
    expect(slack.message("gave back 3 GPUs")).to_contain_text("CUDA_VISIBLE_DEVICES=0")
    expect(granted).to_contain_text("You hold 1 GPU")  # the lease's home, redrawn in place
    shrunk = services.lease(training.id)
    assert shrunk is not None
    assert [("a100-node-01", 0)] == [(gpu.node, gpu.index) for gpu in shrunk.gpus]
    gpus = slack.page.locator(".node", has_text="a100-node-01").locator(".gpu")
    slack.screenshot("demo-partial")
    thread.get_by_role("button", name="Close thread").click()
    expect(gpus.nth(1)).to_have_attribute("data-status", "free")
