"""What the bot refuses or asks to confirm, as people see it: a click from someone who may not
cannot read."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.browser.workspace import ALICE, BOB, GPU, VISION_APPROVALS, SlackPage


def test_an_approve_click_from_someone_who_may_not_approve_is_refused(slack: SlackPage) -> None:
    """Bob reads his team's approvals channel, but his Approve only earns him a refusal."""
    slack.open(ALICE, GPU)
    slack.send("/gpu borrow 4 a100 for 2h because ablations")
    slack.message("needs approval")

    slack.act_as(BOB)
    slack.go(VISION_APPROVALS)
    card = slack.message("GPU request")
    slack.click(card, "Approve")
    refusal = slack.message("You may not approve or deny")
    expect(refusal.locator(".only-you")).to_be_visible()
    expect(refusal).to_contain_text("you are not a manager of vision, so you cannot approve this")
    expect(card.get_by_role("button", name="Approve")).to_be_visible()
    assert ["pending"] == [r.state for r in slack.demo.bot.services.requests(ALICE)]


def test_a_command_the_bot_cannot_read_gets_a_helpful_reply(slack: SlackPage) -> None:
    """A typo is answered with what the bot understood and what to type instead."""
    slack.open(ALICE, GPU)
    slack.send("/gpu borow 2 a100")
    reply = slack.message("Did you mean")
    expect(reply).to_contain_text("/gpu borrow 2 a100")
    expect(reply.locator(".only-you")).to_be_visible()


def test_release_asks_for_confirmation_and_cancel_keeps_the_lease(slack: SlackPage) -> None:
    """The danger button's confirm dialog: Cancel sends nothing; confirming releases."""
    slack.open(ALICE, "dm")
    granted = slack.message("Your GPUs are ready: L1")
    granted.get_by_role("button", name="Release", exact=True).click()
    dialog = slack.page.get_by_role("alertdialog")
    expect(dialog).to_contain_text("Release L1?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    assert ["active"] == [lease.state for lease in slack.demo.bot.services.leases(ALICE)]
    granted.get_by_role("button", name="Release", exact=True).click()
    with slack.page.expect_response("**/ui/action"):
        dialog.get_by_role("button", name="Release").click()
    released = slack.message("Released L1")
    expect(released.locator(".only-you")).to_be_visible()
    assert [] == slack.demo.bot.services.leases(ALICE)
