"""`/gpu report`: what people type, the bars, the figures and buttons of the answer, and the
wording when there is nothing to show or the text cannot be read."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.slack.blocks.reports import (
    REPORT_CHART_ACTION,
    REPORT_CSV_ACTION,
    ReportButton,
    bar,
    read_button,
    report_message,
)
from bot.slack.parse import ParseProblem, Report, parse
from rules.reports import (
    Counts,
    Figures,
    Line,
    Scope,
    ScopeKind,
    Usage,
    Window,
)
from rules.reports import Report as ReportView
from tests.unit.slack.builders import a_lease, assert_within_limits, texts_of

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
POOLS = ("a100", "l40s", "inference")
TEAMS = ("vision", "nlp", "platform")
H = 3600.0
VICTOR, ALICE, BOB = "U0VMGR001", "U0ALICE01", "U0BOB0001"
VISION = Scope(ScopeKind.TEAM, "vision")


def read(text: str) -> object:
    return parse(text, now=NOW, tz=ZoneInfo("UTC"), pools=POOLS, teams=TEAMS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("report", Report()),
        ("report me", Report(ScopeKind.ME)),
        ("report lab 30d", Report(ScopeKind.LAB, "", "30d")),
        ("report team vision", Report(ScopeKind.TEAM, "vision")),
        ("report Team Vision 7d", Report(ScopeKind.TEAM, "vision", "7d")),
        ("report team", Report(ScopeKind.TEAM)),
        ("report team 30d", Report(ScopeKind.TEAM, "", "30d")),
        ("report pool a100 2026-11", Report(ScopeKind.POOL, "a100", "2026-11")),
        ("report 24h lab", Report(ScopeKind.LAB, "", "24h")),
        ("report 30d", Report(None, "", "30d")),
        ("report the last 30 days", Report(None, "", "30d")),
        ("report team vision 2 weeks", Report(ScopeKind.TEAM, "vision", "2w")),
        ("report me 48hrs", Report(ScopeKind.ME, "", "48h")),
        ("report lab 007D", Report(ScopeKind.LAB, "", "7d")),
        ("report observe 30d", Report(None, "", "30d", observe=True)),
    ],
)
def test_report_text_reads_as_a_scope_and_a_window(text: str, expected: Report) -> None:
    """Scope and window in any order; no scope is the person's default, no window 7 days."""
    assert expected == read(text)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (
            "report team visoin 7d",
            [
                "I read `report team visoin 7d`: there is no team `visoin` (did you mean "
                "vision?); teams: vision, nlp, platform.",
                "Try: `/gpu report team vision 7d`",
            ],
        ),
        (
            "report pool h100",
            ["there is no pool `h100` (did you mean a100?); pools: a100, l40s, inference."],
        ),
        (
            "report pool zzz 30d",
            ["no pool `zzz`; pools: a100, l40s, inference.", "`/gpu report pool a100 30d`"],
        ),
        ("report pool", ["which pool? Pools: a100, l40s, inference.", "`/gpu report pool a100"]),
        ("report lab 7x", ["I read `report lab 7x`:", "`7x`", "Try: `/gpu report lab 7d`"]),
        ("report everyone", ["I do not know what `everyone` means here."]),
        ("report me lab", ["`lab` is a second scope after `me`; a report covers one.",
                           "Try: `/gpu report me 7d`"]),
        ("report 7d 30d", ["`30d` is a second window after `7d`; give one."]),
        ("report team vision nlp", ["I do not know what `nlp` means here. A report takes a "
                                    "scope (me, team T, pool P or lab) and a window",
                                    "Try: `/gpu report team vision 7d`"]),
        ("report 2027-01", ["January 2027 has not begun yet.", "Try: `/gpu report 7d`"]),
        ("report 99999999999999999999d", ["outside what reports cover (1h to 400d)"]),
        ("report last month", ["I read `report last month`: for a month, write 30d.",
                               "Try: `/gpu report 30d`"]),
        ("report lab today", ["for today, write 24h.", "Try: `/gpu report lab 24h`"]),
        ("report <@U0BOB0001>", ["I read `report <@U0BOB0001>`: a report covers you, a team, "
                                 "a pool or the lab, not `<@U0BOB0001>`; a manager sees their "
                                 "team person by person with `/gpu report team`."]),
        ("report observe lab", ["`report observe` covers every observe-only rule and takes "
                                "only a window", "Try: `/gpu report observe 7d`"]),
    ],
)  # fmt: skip
def test_report_text_that_cannot_be_read_says_what_was_read_and_how_to_fix_it(
    text: str, fragments: list[str]
) -> None:
    """Each problem quotes the text read, names what is wrong and ends with an example."""
    problem = read(text)
    assert isinstance(problem, ParseProblem)
    for fragment in fragments:
        assert fragment in problem.message()
    assert "Try: `/gpu report" in problem.message()


@pytest.mark.parametrize(
    ("efficiency", "expected"),
    [
        (0.64, "████████░░░░  64 %"),  # 7.68 of 12 cells: 8
        (0.8, "██████████░░  80 %"),  # 9.6: 10
        (1.0, "████████████ 100 %"),
        (0.0, "░░░░░░░░░░░░   0 %"),
        (1.3, "████████████ 130 %"),  # more used than allocated: the bar stops full
        (None, "░░░░░░░░░░░░    – "),  # nothing allocated
    ],
)
def test_the_text_bar_has_a_fixed_width(efficiency: float | None, expected: str) -> None:
    """Twelve cells and a four-character percentage, so the bars line up in a code span."""
    assert expected == bar(efficiency)
    assert len(expected) == 18


def hours(allocated: float, used: float, **more: float) -> Usage:
    extra = {name: value * H for name, value in more.items()}
    return Usage(allocated_s=allocated * H, used_s=used * H, **extra)


def a_report(**overrides: Any) -> ReportView:
    since, until = datetime(2026, 11, 25, 9, tzinfo=UTC), NOW
    figures = Figures(
        usage=hours(80, 51.2, idle_s=20, unknown_s=2, cost=200 / H),
        wait_p50_s=240.0,
        wait_p90_s=4200.0,
        granted=12,
        counts=Counts(reclaims=2, extensions=5, recalls=1),
    )
    lines = (Line(BOB, hours(30, 11.2)), Line(ALICE, hours(50, 40)))
    report = ReportView(
        scope=VISION,
        window=Window(since, until, "last 7 days"),
        figures=figures,
        lines=lines,
        by="holder",
        days=(),
        currency="USD",
        priced=True,
    )
    return replace(report, **overrides)


NAMES = {ALICE: "Alice Anders", BOB: "Bob Brown"}


def drawn(report: ReportView, window: str = "7d", tz: ZoneInfo | None = None) -> Any:
    return report_message(
        report,
        viewer=VICTOR,
        window_text=window,
        tz=tz or ZoneInfo("UTC"),
        label=lambda who: NAMES.get(who, f"<@{who}>"),
    )


def test_a_managers_team_report_shows_the_figures_and_a_bar_per_person() -> None:
    """80 GPU-h allocated, 51.2 used: 64 %; Alice 40 of 50 (80 %) before Bob 11.2 of 30 (37 %)."""
    shown = drawn(a_report())
    assert_within_limits(shown)
    assert "Team vision · last 7 days (Nov 25 - Dec 2)" == shown.blocks[0]["text"]["text"]
    fields = [f["text"] for f in shown.blocks[1]["fields"]]
    assert [
        "*Allocated*\n80.0 GPU-h",
        "*Used*\n51.2 GPU-h",
        "*Efficiency*\n64 %",
        "*Idle while allocated*\n20.0 GPU-h",
        "*Unknown* (no readings)\n2.0 GPU-h",
        "*Cost*\n200.00 USD",
        "*Wait for GPUs*\nmedian 4m, 90 % within 1h 10m (12 granted)",
        "*Reclaims · extensions · recalls*\n2 · 5 · 1",
    ] == fields
    assert (
        "*By person*\n"
        "`██████████░░  80 %`  *Alice Anders*  40.0 of 50.0 GPU-h\n"
        "`████░░░░░░░░  37 %`  *Bob Brown*  11.2 of 30.0 GPU-h"
    ) == shown.blocks[2]["text"]["text"]
    assert "51.2 of 80.0 GPU-h used (64 %)" in shown.text


def test_the_buttons_carry_the_scope_the_window_and_the_viewer() -> None:
    """Chart and CSV carry the same small JSON value, which reads back as the report asked."""
    shown = drawn(a_report(), window="2026-11")
    buttons = next(b for b in shown.blocks if b["type"] == "actions")["elements"]
    assert [REPORT_CHART_ACTION, REPORT_CSV_ACTION] == [b["action_id"] for b in buttons]
    assert ["Chart", "CSV"] == [b["text"]["text"] for b in buttons]
    value = {"viewer": VICTOR, "scope": "team", "name": "vision", "window": "2026-11"}
    assert [value, value] == [json.loads(b["value"]) for b in buttons]
    assert ReportButton(VICTOR, VISION, "2026-11") == read_button(buttons[0]["value"])


@pytest.mark.parametrize(
    "value",
    [
        "",
        "42",
        "not json",
        '{"viewer":"U0A","scope":"team","name":"vision"}',
        '{"viewer":"U0A","scope":"galaxy","name":"","window":""}',
        '{"viewer":1,"scope":"me","name":"","window":""}',
        '{"viewer":"U0A","scope":"me","name":"","window":"","more":"x"}',
    ],
)
def test_a_value_no_report_button_carries_reads_as_nothing(value: str) -> None:
    """Forged or truncated values never become a report."""
    assert read_button(value) is None


def test_unreserved_use_is_shown_for_the_lab_and_pools_only() -> None:
    """A team's report has no unreserved line; the lab's has, per team, and unpriced no cost."""
    team = texts_of(drawn(a_report()))
    assert "Unreserved" not in team
    lines = (Line("vision", hours(80, 51.2)), Line("", hours(0, 0, unreserved_s=3)))
    lab = drawn(
        a_report(
            scope=Scope(ScopeKind.LAB),
            by="team",
            lines=lines,
            priced=False,
            figures=replace(a_report().figures, usage=hours(80, 51.2, unreserved_s=3)),
        )
    )
    text = texts_of(lab)
    assert "*Unreserved* (busy, no lease)\n3.0 GPU-h" in text
    assert "Cost" not in text
    assert "*By team*" in text
    assert "`░░░░░░░░░░░░    – `  _without a lease_  3.0 GPU-h busy without a lease" in text
    assert lab.blocks[0]["text"]["text"].startswith("The whole lab · ")


def test_at_most_fifteen_lines_then_how_many_more() -> None:
    """17 people: the 15 with the most allocated GPU-h, then "and 2 more"."""
    lines = tuple(Line(f"U0P{n:06d}", hours(n + 1, n / 2)) for n in range(17))
    shown = drawn(a_report(lines=lines))
    assert_within_limits(shown)
    breakdown = next(b for b in shown.blocks if "By person" in b.get("text", {}).get("text", ""))
    rows = breakdown["text"]["text"].split("\n")[1:]
    assert 15 == len(rows)
    assert "<@U0P000016>" in rows[0]  # 17 GPU-h allocated: the most
    assert "<@U0P000002>" in rows[-1]
    assert "…and 2 more." in texts_of(shown)


def test_no_use_in_the_window_says_so_and_suggests_a_longer_one() -> None:
    """Nothing allocated and nothing unreserved: no figures, no buttons, a longer window."""
    empty = replace(a_report().figures, usage=Usage())
    shown = drawn(a_report(figures=empty, lines=()))
    assert_within_limits(shown)
    assert "actions" not in [b["type"] for b in shown.blocks]
    assert "Team vision · last 7 days (Nov 25 - Dec 2): no GPU use." == shown.text
    assert (
        "No GPU use by team vision in this window. "
        "A longer window may show some: `/gpu report team vision 30d`."
    ) == shown.blocks[1]["text"]["text"]
    month = a_report(
        figures=empty,
        lines=(),
        window=Window(datetime(2026, 11, 1, tzinfo=UTC), NOW.replace(day=1), "November 2026"),
    )
    assert "`/gpu report team vision 2026-10`" in texts_of(drawn(month, window="2026-11"))


def test_the_days_are_those_of_the_readers_zone() -> None:
    """The same window read in Tokyo (UTC+9) starts and ends on later days."""
    window = Window(datetime(2026, 11, 24, 20, tzinfo=UTC), NOW, "last 7 days")
    shown = drawn(a_report(window=window), tz=ZoneInfo("Asia/Tokyo"))
    assert "Team vision · last 7 days (Nov 25 - Dec 2)" == shown.blocks[0]["text"]["text"]
    assert "Days are in Asia/Tokyo." in texts_of(shown)


def test_a_line_a_day_with_allocated_used_and_the_bar_a_dash_for_an_empty_day() -> None:
    """Three New York days: 14 GPU-h allocated and 9 used (64 %), 4 of 4 (100 %), nothing."""
    york = ZoneInfo("America/New_York")
    window = Window(datetime(2026, 11, 24, tzinfo=york), datetime(2026, 11, 27, tzinfo=york), "3d")
    days = (
        Line("2026-11-24", hours(14, 9)),
        Line("2026-11-25", hours(4, 4)),
        Line("2026-11-26", Usage()),
    )
    shown = drawn(a_report(window=window, days=days), tz=york)
    assert_within_limits(shown)
    (daily,) = day_sections(shown)
    assert (
        "*Day by day* (GPU-h allocated, used)\n"
        "`Tue 24 Nov     14.0      9.0  ████████░░░░  64 %`\n"
        "`Wed 25 Nov      4.0      4.0  ████████████ 100 %`\n"
        "`Thu 26 Nov        —`"
    ) == daily


def a_month(days: int, allocated: float) -> tuple[Window, tuple[Line, ...]]:
    since = datetime(2026, 10, 1, tzinfo=UTC)
    lines = tuple(
        Line(f"2026-10-{n + 1:02d}", hours(allocated, allocated / 3)) for n in range(days)
    )
    return Window(since, since + timedelta(days=days), "a month"), lines


def day_sections(shown: Any) -> list[str]:
    """The texts of the sections that hold days (their lines start with a weekday)."""
    texts = [b.get("text", {}).get("text", "") for b in shown.blocks if b["type"] == "section"]
    return [t for t in texts if re.search(r"^`(Mon|Tue|Wed|Thu|Fri|Sat|Sun) ", t, re.MULTILINE)]


def test_a_months_days_stay_within_slacks_limits_several_a_section() -> None:
    """The lab over 31 days of five-figure GPU-h, with 17 teams: every day shown, eight a
    section, the message within 50 blocks and 3,000 characters a section."""
    window, days = a_month(31, 12_345.6)
    teams = tuple(Line(f"team-{n:02d}", hours(n + 1, n / 2)) for n in range(17))
    shown = drawn(a_report(scope=Scope(ScopeKind.LAB), by="team", lines=teams, window=window,
                           days=days))  # fmt: skip
    assert_within_limits(shown)
    daily = day_sections(shown)
    rows = [row for text in daily for row in text.split("\n") if row.startswith("`")]
    assert 31 == len(rows)
    assert [8, 8, 8, 7] == [
        len([r for r in text.split("\n") if r.startswith("`")]) for text in daily
    ]
    assert "`Thu 1 Oct  12,345.6  4,115.2  ████░░░░░░░░  33 %`" == rows[0]
    assert all(len(text) <= 3000 for text in daily)


def test_a_window_longer_than_a_month_leaves_the_days_to_the_chart() -> None:
    window, days = a_month(40, 1.0)
    assert "Day by day" not in texts_of(drawn(a_report(window=window, days=days), window="40d"))


def test_the_figures_say_how_far_the_hours_summed_go() -> None:
    """Rolled up to 08:00 on the window's last day: said in the reader's zone."""
    shown = drawn(a_report(through=datetime(2026, 12, 2, 8, tzinfo=UTC)))
    assert "Whole hours to 08:00 (this hour's use shows after it ends)." in texts_of(shown)
    assert "Whole hours" not in texts_of(drawn(a_report()))


def test_a_lease_not_summed_yet_is_named_instead_of_no_use() -> None:
    """Alice's L12, 2 GPUs since 09:10, with the hours summed to 09:00 at 09:50: it will
    appear after 10:00; never "No GPU use"."""
    empty = replace(a_report().figures, usage=Usage())
    me = a_report(
        scope=Scope(ScopeKind.ME, ALICE),
        figures=empty,
        lines=(),
        window=Window(NOW - timedelta(days=7), NOW.replace(minute=50), "last 7 days"),
        through=NOW,
    )
    lease = a_lease(id=12, granted_at=NOW.replace(minute=10))
    shown = report_message(me, viewer=ALICE, window_text="", tz=ZoneInfo("UTC"), running=[lease])
    assert_within_limits(shown)
    said = texts_of(shown)
    assert "No GPU use" not in said
    assert (
        "Your lease L12 (2 GPUs since 09:10) will appear in reports after 10:00.\n"
        "Whole hours to 09:00 (this hour's use shows after it ends)."
    ) == shown.blocks[1]["text"]["text"]


def test_a_running_lease_is_not_named_under_a_window_summed_to_its_end() -> None:
    """October, summed whole: a lease held now has nothing to do with it."""
    empty = replace(a_report().figures, usage=Usage())
    october = a_report(
        scope=Scope(ScopeKind.ME, ALICE),
        figures=empty,
        lines=(),
        window=Window(
            datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC), "October 2026"
        ),
    )
    shown = report_message(
        october, viewer=ALICE, window_text="2026-10", tz=ZoneInfo("UTC"), running=[a_lease()]
    )
    said = texts_of(shown)
    assert "No GPU use by you in this window." in said
    assert "Your lease" not in said
