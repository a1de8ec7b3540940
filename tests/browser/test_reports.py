"""The tour's last step in a real browser: Victor, vision's manager, asks for his team's week
(the demo's seeded history), sees it person by person with text bars, and *Chart* shares it as
a PNG in the channel; Alice, a member, sees only the team's totals."""

from __future__ import annotations

import pytest
from playwright.sync_api import ViewportSize, expect

from tests.browser.workspace import ALICE, GPU, VICTOR, SlackPage

# Tall enough for the report and its chart in one screenshot (docs/demo-report.png).
TALL: ViewportSize = {"width": 1440, "height": 1120}


@pytest.mark.parametrize("viewport", [TALL], indirect=True)
def test_a_manager_reads_his_teams_week_from_the_seeded_history(slack: SlackPage) -> None:
    """The figures are the ones tests/unit/workspace/test_history.py adds up by hand."""
    slack.open(VICTOR, GPU)
    slack.send("/gpu report team vision")
    report = slack.message("Team vision")
    expect(report.locator(".only-you")).to_be_visible()
    expect(report).to_contain_text("374.0 GPU-h")  # allocated
    expect(report).to_contain_text("286.7 GPU-h")  # used
    expect(report).to_contain_text("856.00 USD")
    expect(report).to_contain_text("Alice Anders")
    expect(report).to_contain_text("Bob Brown")
    expect(report.get_by_role("button", name="Chart", exact=True)).to_be_visible()
    expect(report.get_by_role("button", name="CSV", exact=True)).to_be_visible()
    slack.click(report, "Chart")
    drawn = slack.message("the chart Victor Vision asked for", timeout_ms=20_000)
    chart = drawn.locator(".file-image img")
    expect(chart).to_be_visible(timeout=20_000)
    expect(chart).to_have_js_property("complete", value=True)
    assert chart.evaluate("img => img.naturalWidth") > 0
    chart.scroll_into_view_if_needed()
    slack.screenshot("demo-report")

    slack.act_as(ALICE)
    slack.send("/gpu report team vision")
    totals = slack.message("Team vision")
    expect(totals).to_contain_text("374.0 GPU-h")
    expect(totals).not_to_contain_text("Bob Brown")  # a member sees no one else's use
