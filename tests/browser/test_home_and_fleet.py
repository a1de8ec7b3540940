"""The App Home tab and its borrow form, and the fleet panel as the demo clock moves on."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser.workspace import ALICE, BOB, SlackPage

DAVE = "U0DAVE001"


def test_the_borrow_form_on_the_home_tab_shows_field_errors_then_borrows(
    slack: SlackPage,
) -> None:
    """Home shows the person's lease; its form is a modal whose errors appear by the field."""
    slack.open(ALICE, "home")
    home = slack.page.locator("#home")
    expect(home).to_contain_text("L1")
    slack.screenshot("demo-home")
    slack.click(home, "Borrow GPUs")
    form = slack.page.get_by_role("dialog", name="Borrow GPUs")
    form.get_by_label("Pool").select_option("l40s")
    form.get_by_label("How many GPUs").fill("1")
    form.get_by_label("For how long").fill("someday")
    form.get_by_label("Why").fill("a quick evaluation")
    form.get_by_role("button", name="Borrow").click()
    expect(form.get_by_role("alert")).to_contain_text("I did not understand `someday`")
    expect(form.get_by_label("Pool")).to_have_value("l40s")  # what was typed stays
    slack.screenshot("demo-modal")
    form.get_by_label("For how long").fill("3h")
    form.get_by_role("button", name="Borrow").click()
    expect(form).to_have_count(0)
    slack.go("dm")
    expect(slack.message("Your GPUs are ready")).to_contain_text("l40s")
    slack.go("home")  # opened again, it is drawn afresh: both leases, each with its buttons
    lease = slack.demo.bot.services.leases(ALICE)[0]
    expect(home).to_contain_text(lease.code)
    expect(home.get_by_role("button", name="Extend")).to_have_count(2)


def test_unreserved_use_shows_in_the_fleet_and_one_click_reserves_it(slack: SlackPage) -> None:
    """Dave's process runs without a lease from the start: the panel marks the GPU at once,
    Dave gets a DM at the first sweep, and its button borrows exactly that GPU."""
    slack.open(DAVE, "dm")
    gpu = slack.page.locator(".node", has_text="a100-node-02").locator(".gpu").nth(6)
    expect(gpu).to_have_attribute("data-status", "unreserved")
    slack.forward("10 minutes")
    notice = slack.message("without a lease")
    slack.click(notice, "Borrow 1 a100 for 4h")
    slack.message("Granted")
    expect(gpu).to_have_attribute("data-status", "busy")
    expect(gpu).to_contain_text(re.compile(r"L\d+ Dave Dias"))


def test_an_idle_lease_is_warned_and_then_reclaimed_as_time_moves_on(slack: SlackPage) -> None:
    """Bob's forgotten notebook holds an l40s GPU doing nothing: warned after 90 idle minutes,
    reclaimed after the 30 minutes of grace; the grant DM says how it ended, the reclaim notice
    is a reply in its thread."""
    slack.open(BOB, "dm")
    slack.forward("1 hour")
    slack.forward("1 hour")
    # The idle warning, a reply also sent to the DM, redrawn once the lease ended: no buttons.
    warning = slack.message("warned of idle GPUs")
    expect(warning).to_contain_text("reclaimed because its GPUs stayed idle")
    expect(warning.get_by_role("button")).to_have_count(0)
    home = slack.page.locator(".message", has_text="has ended").filter(
        has=slack.page.locator(".replies")
    )
    expect(home).to_contain_text("l40s-node-02")
    thread = slack.thread(home)
    expect(thread.locator(".message", has_text="was reclaimed")).to_contain_text("l40s")
    thread.get_by_role("button", name="Close thread").click()
    gpu = slack.page.locator(".node", has_text="l40s-node-02").locator(".gpu").nth(1)
    expect(gpu).to_have_attribute("data-status", "unreserved")
