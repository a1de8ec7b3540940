"""The page on a laptop and on a large screen: it never scrolls as a whole, the composer and the
clock stay put, channels open at their newest message; Slack's button colours, unread badges,
day dividers, grouped messages, threads, emoji without an emoji font, modals that do not outlive
their window, and a fast-forward that answers at once."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import ViewportSize, expect

from bot.workspace.demo import Demo
from tests.browser.workspace import ALICE, BOB, GPU, SlackPage

LAPTOP: ViewportSize = {"width": 1280, "height": 720}
DESKTOP: ViewportSize = {"width": 1920, "height": 1080}
SCREENS = pytest.mark.parametrize(
    "viewport", [LAPTOP, DESKTOP], ids=["1280x720", "1920x1080"], indirect=True
)
RED, GREEN, WHITE = "rgb(224, 30, 90)", "rgb(0, 122, 90)", "rgb(255, 255, 255)"

# Whether the bottom of the newest message in `list` is in view, and `list` inside the window.
NEWEST_IN_VIEW = """(list) => {
  const box = document.querySelector(list).getBoundingClientRect();
  const rows = document.querySelectorAll(`${list} .message`);
  const last = rows[rows.length - 1].getBoundingClientRect();
  return last.bottom <= box.bottom + 1 && last.bottom > box.top && box.bottom <= innerHeight;
}"""
# The pictographs in the page that are drawn as the missing-glyph box, found by drawing each on
# a canvas beside a private-use code point that no font has.
TOFU = """() => {
  const canvas = document.createElement("canvas");
  canvas.width = 48; canvas.height = 32;
  const g = canvas.getContext("2d");
  const font = getComputedStyle(document.body).fontFamily;
  const draw = (text) => {
    g.clearRect(0, 0, 48, 32); g.font = `24px ${font}`; g.textBaseline = "top";
    g.fillText(text, 2, 2);
    return `${g.measureText(text).width}:${g.getImageData(0, 0, 48, 32).data.join()}`;
  };
  const box = draw("\\u{10FFFD}");
  const walker = document.createTreeWalker(document.getElementById("app"), NodeFilter.SHOW_TEXT);
  const seen = [], tofu = [];
  while (walker.nextNode()) {
    for (const m of walker.currentNode.nodeValue.matchAll(/\\p{Extended_Pictographic}\\uFE0F?/gu)) {
      seen.push(m[0]);
      if (draw(m[0]) === box) tofu.push(m[0]);
    }
  }
  return { seen, tofu, badges: document.querySelectorAll("#app .emoji-text").length };
}"""


def page_scrolls(slack: SlackPage) -> bool:
    return bool(
        slack.page.evaluate(
            "() => { scrollBy(0, 400); const moved = scrollY > 0;"
            " return moved || document.scrollingElement.scrollHeight > innerHeight; }"
        )
    )


def background(slack: SlackPage, selector: str) -> str:
    return str(
        slack.page.locator(selector).first.evaluate("n => getComputedStyle(n).backgroundColor")
    )


@SCREENS
def test_the_page_fits_the_screen_and_a_channel_opens_at_its_newest_message(
    slack: SlackPage, viewport: ViewportSize
) -> None:
    """Forty messages overflow the list, not the page: the composer and the clock stay in
    view, the channel opens scrolled to the newest, and a new answer scrolls into view."""
    for n in range(40):
        slack.demo.local.workspace.post(GPU, f"progress note {n}", user=BOB)
    slack.open(ALICE, GPU)
    slack.message("progress note 39")
    messages = slack.page.locator("#messages")
    assert messages.evaluate("n => n.scrollHeight > n.clientHeight")  # it does overflow
    slack.page.wait_for_function(NEWEST_IN_VIEW, arg="#messages")
    assert not page_scrolls(slack)
    for part in ("#text", "#clock", "#person"):
        box = slack.page.locator(part).bounding_box()
        assert box is not None
        assert 0 <= box["y"], part
        assert box["y"] + box["height"] <= viewport["height"], part
    # Bob's forty notes, seconds apart, are one group under one name, after one day divider.
    expect(messages.locator(".message[data-author=U0BOB0001] .author")).to_have_count(1)
    expect(messages.locator(".day")).to_have_text(["Today"])
    slack.send("/gpu mine")
    slack.message("L1")
    slack.page.wait_for_function(NEWEST_IN_VIEW, arg="#messages")
    assert not page_scrolls(slack)


@SCREENS
def test_buttons_have_slacks_colours_and_a_danger_confirm_is_red(slack: SlackPage) -> None:
    """Primary green and filled, danger red and filled, default outlined; Release asks first,
    and its dialog's confirm button is red too."""
    slack.open(ALICE, "home")
    home = slack.page.locator("#home")
    release = home.get_by_role("button", name="Release", exact=True).first
    expect(release).to_be_visible()
    assert RED == background(slack, "#home .btn.danger")
    assert GREEN == background(slack, "#home .btn.primary")
    assert WHITE == background(slack, "#clock .btn")
    release.click()
    dialog = slack.page.get_by_role("alertdialog")
    confirm = dialog.get_by_role("button", name="Release", exact=True)
    expect(confirm).to_have_class(re.compile(r"\bdanger\b"))
    assert RED == confirm.evaluate("n => getComputedStyle(n).backgroundColor")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    assert slack.demo.bot.services.leases(ALICE)  # nothing was released


@SCREENS
def test_a_modal_closes_on_reload_and_on_a_switch_of_person(slack: SlackPage) -> None:
    slack.open(ALICE, "home")
    form = slack.page.get_by_role("dialog", name="Borrow GPUs")
    slack.click(slack.page.locator("#home"), "Borrow GPUs")
    expect(form).to_be_visible()
    slack.page.reload()
    expect(slack.page.locator(f"body[data-person={ALICE}]")).to_be_attached()
    expect(form).to_have_count(0)
    assert [] == slack.demo.local.workspace.views.modals(ALICE)
    slack.click(slack.page.locator("#home"), "Borrow GPUs")
    expect(form).to_be_visible()
    slack.act_as(BOB)
    expect(form).to_have_count(0)
    slack.act_as(ALICE)
    expect(slack.page.locator("#home")).to_contain_text("L1")
    expect(form).to_have_count(0)
    assert [] == slack.demo.local.workspace.views.modals(ALICE)


@SCREENS
def test_fast_forward_answers_at_once_and_shows_its_progress(slack: SlackPage) -> None:
    """With the demo's time held, the click is still answered and the page shows the skip
    under way; let go, the hour passes with its sweeps and the page says so."""
    demo: Demo = slack.demo
    slack.open(ALICE, GPU)
    clock = slack.page.locator("#clock")
    with demo._time:  # the lock every step of a fast-forward takes
        with slack.page.expect_response("**/ui/forward", timeout=5_000) as answer:
            clock.get_by_role("button", name="1 hour").click()
        assert {"ok": True, "job": 1} == answer.value.json()
        expect(clock.get_by_role("progressbar")).to_be_visible()
        expect(clock).to_contain_text("fast-forwarding… 0 of 60 minutes")
        expect(clock.get_by_role("button", name="10 minutes")).to_be_disabled()
    expect(slack.page.locator("body[data-forwarded='1']")).to_be_attached(timeout=120_000)
    expect(clock.get_by_role("progressbar")).to_have_count(0)
    expect(clock).to_contain_text("1h ahead of real time")


@SCREENS
def test_unread_badges_threads_and_emoji_without_an_emoji_font(slack: SlackPage) -> None:
    """The DM's opening messages are unread until opened; replies sit in a thread pane, the
    broadcast one in the channel too; no pictograph is drawn as a box."""
    slack.open(ALICE, GPU)
    dm_link = slack.page.locator("[data-conversation^=D]")
    expect(dm_link.locator(".badge")).to_be_visible()
    slack.go("dm")
    expect(dm_link.locator(".badge")).to_have_count(0)
    client = slack.demo.bot.app.client
    dm = slack.demo.local.workspace.dm_channel(ALICE)
    parent = client.chat_postMessage(
        channel=dm, text=":white_check_mark: L9 is yours :tada: ⛔ ⏩"
    )["ts"]
    client.chat_postMessage(channel=dm, text=":warning: L9 ends in 59m", thread_ts=parent)
    client.chat_postMessage(
        channel=dm, text=":hourglass: L9 ends in 9m", thread_ts=parent, reply_broadcast=True
    )
    slack.demo.local.workspace.post(GPU, "lunch?", user=BOB)
    expect(slack.page.locator(f"[data-conversation={GPU}] .badge")).to_have_text("1")

    messages = slack.page.locator("#messages")
    expect(messages).not_to_contain_text("ends in 59m")
    broadcast = slack.message("ends in 9m")
    expect(broadcast).to_contain_text("replied to a thread")
    card = messages.locator(f".message[data-ts='{parent}']")
    card.get_by_role("button", name=re.compile("2 replies")).click()
    thread = slack.page.locator("#thread")
    expect(thread).to_be_visible()
    expect(slack.page.locator("#fleet")).to_be_hidden()
    expect(thread.locator(".message")).to_have_count(3)
    expect(thread).to_contain_text("ends in 59m")
    expect(thread.locator(".day")).to_have_count(0)  # the replies came on the parent's day
    expect(thread.locator(".message", has_text="ends in 9m")).to_contain_text(
        "also sent to the channel"
    )
    assert not page_scrolls(slack)
    glyphs = slack.page.evaluate(TOFU)
    assert [] == glyphs["tofu"]
    assert len(glyphs["seen"]) + glyphs["badges"] >= 5  # the check saw the emoji above
    thread.get_by_role("button", name="Close thread").click()
    expect(slack.page.locator("#fleet")).to_be_visible()
