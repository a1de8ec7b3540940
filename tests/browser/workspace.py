"""`SlackPage`: a person using the workspace page, in the words of the page (people, sidebar,
composer, buttons, the demo clock), so the tests read like the story they tell."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Locator, Page, expect

from bot.workspace.demo import Demo

ALICE, BOB, VICTOR, ADA = "U0ALICE01", "U0BOB0001", "U0VMGR001", "U0ADMIN01"
GPU, VISION_APPROVALS = "C0GPU", "C0VAPPROV"


class SlackPage:
    def __init__(self, page: Page, demo: Demo, url: str, shots: Path) -> None:
        self.page, self.demo, self.url, self.shots = page, demo, url, shots

    def open(self, person: str = ALICE, where: str = GPU) -> None:
        self.page.goto(f"{self.url}?as={person}&in={where}")
        expect(self.page.locator(f"body[data-person={person}]")).to_be_attached()

    def act_as(self, person: str) -> None:
        """The switch at the top of the sidebar; waits until the page shows their view."""
        self.page.select_option("#person", person)
        # the page asks for the new person's view after telling the demo; under load, a while
        expect(self.page.locator(f"body[data-person={person}]")).to_be_attached(timeout=15_000)

    def go(self, conversation: str) -> None:
        """A channel by id, `dm` for the DM with the bot, `home` for the App Home."""
        target = "[data-conversation^=D]" if conversation == "dm" else None
        link = self.page.locator(target or f"[data-conversation={conversation}]")
        link.click()
        expect(link).to_have_class(re.compile(r"\bactive\b"))

    def send(self, text: str) -> None:
        """Type into the composer and press Enter, as in Slack."""
        self.page.fill("#text", text)
        with self.page.expect_response("**/ui/command") as answer:
            self.page.press("#text", "Enter")
        assert answer.value.ok, answer.value.text()

    def message(self, containing: str, *, timeout_ms: float = 5_000) -> Locator:
        """The newest message in view with this text; waits for it to arrive (longer for what
        the bot makes after its answer, such as a chart, on a loaded machine)."""
        found = self.page.locator(".message", has_text=containing).last
        expect(found).to_be_visible(timeout=timeout_ms)
        return found

    def thread(self, message: Locator) -> Locator:
        """Open a message's thread with its "N replies" link; the thread pane, once drawn."""
        message.locator(".replies").click()
        pane = self.page.locator("#thread")
        expect(pane).to_be_visible()
        return pane

    def click(self, message: Locator, button: str) -> None:
        with self.page.expect_response("**/ui/action") as answer:
            message.get_by_role("button", name=button, exact=True).click()
        assert answer.value.ok, answer.value.text()

    def forward(self, label: str) -> None:
        """One of the demo clock's fast-forward buttons: answered at once, with the progress on
        the page; returns when the time has passed and the page has drawn it."""
        with self.page.expect_response("**/ui/forward", timeout=5_000) as answer:
            self.page.get_by_role("button", name=label).click()
        assert answer.value.ok, answer.value.text()
        job = answer.value.json()["job"]
        done = self.page.locator(f"body[data-forwarded='{job}']")
        expect(done).to_be_attached(timeout=120_000)

    def screenshot(self, name: str) -> None:
        self.page.wait_for_timeout(300)  # let the last poll's redraw settle
        self.page.screenshot(path=self.shots / f"{name}.png")
