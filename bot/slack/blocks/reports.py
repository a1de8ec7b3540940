"""`/gpu report`: the figures of a scope over a window, a text bar of used against allocated
GPU-h per line of the breakdown and, for windows up to a month, per day; how far the hours
summed go; and the *Chart* and *CSV* buttons that post the same report as a file (their value
says which report: scope, window and viewer).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo

from bot.services.results import LeaseView
from bot.slack.blocks.kit import (
    Block,
    Message,
    actions,
    button,
    context,
    escape,
    header,
    mention,
    message,
    section,
)
from rules.domain import format_duration
from rules.reports import Line, Report, Scope, ScopeKind

REPORT_CHART_ACTION = "report_chart"
REPORT_CSV_ACTION = "report_csv"
MAX_LINES = 15  # lines of the breakdown shown; the rest are counted ("and N more")
BAR_WIDTH = 12  # characters of the text bar, so bars line up in Slack's code font
_FULL, _EMPTY = "█", "░"
_BY = {
    "holder": "By person",
    "team": "By team",
    "pool": "By pool",
    "lease": "By lease",
    "day": "By day",
    "hour": "By hour",
}
MAX_DAILY = timedelta(days=31)  # longer windows leave the line a day to the chart and CSV
DAYS_A_SECTION = 8  # well within a section's 3,000 characters, whatever the figures
_SHORT_WINDOWS = ("", "24h", "7d")  # a report this short that shows nothing: suggest 30d


def bar(efficiency: float | None, width: int = BAR_WIDTH) -> str:
    """Used against allocated as a fixed-width text bar and a percentage: `████████░░░░  64 %`.
    Nothing allocated: an empty bar and a dash."""
    if efficiency is None:
        return f"{_EMPTY * width}    – "
    filled = min(width, max(0, round(efficiency * width)))
    return f"{_FULL * filled}{_EMPTY * (width - filled)} {round(efficiency * 100):>3} %"


@dataclass(frozen=True)
class ReportButton:
    """What a *Chart* or *CSV* button carries: which report, for whom."""

    viewer: str
    scope: Scope
    window: str  # as typed: 7d, 30d, 24h, YYYY-MM, or "" (the last 7 days)

    def value(self) -> str:
        data = {
            "viewer": self.viewer,
            "scope": str(self.scope.kind),
            "name": self.scope.name,
            "window": self.window,
        }
        return json.dumps(data, separators=(",", ":"))


def read_button(value: str) -> ReportButton | None:
    """A button's value back; None for anything a report button never carries."""
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != {"viewer", "scope", "name", "window"}:
        return None
    if not all(isinstance(v, str) and len(v) <= 64 for v in data.values()):
        return None
    if data["scope"] not in {str(kind) for kind in ScopeKind}:
        return None
    scope = Scope(ScopeKind(data["scope"]), data["name"])
    return ReportButton(data["viewer"], scope, data["window"])


def report_message(
    report: Report,
    *,
    viewer: str,
    window_text: str,
    tz: tzinfo,
    label: Callable[[str], str] = mention,
    zone: str = "",
    running: Sequence[LeaseView] = (),
) -> Message:
    """The report as an ephemeral answer. `label` shows a person (a Slack id) as mrkdwn;
    `zone` names the time zone the days are counted in (the name of `tz` by default);
    `running`: the person's leases now, named when none of their use is in the figures yet."""
    title = f"{_whose(report.scope, label)} · {_period(report, tz)}"
    usage = report.figures.usage
    if usage.allocated_s <= 0 and usage.unreserved_s <= 0:
        return _nothing(report, title, window_text, tz, label, running)
    blocks: list[Block] = [header(title), section(fields=_figures(report))]
    blocks += _breakdown(report, label)
    blocks += _day_by_day(report)
    button_value = ReportButton(viewer, report.scope, window_text).value()
    blocks.append(
        actions(
            "report",
            button("Chart", REPORT_CHART_ACTION, button_value),
            button("CSV", REPORT_CSV_ACTION, button_value),
        )
    )
    blocks.append(
        context(
            "Efficiency is used GPU-h (weighted by utilisation) over allocated GPU-h. "
            "Unknown time had no working readings and is never counted as idle. "
            f"Days are in {escape(zone or str(tz))}."
            + (f" {extent}" if (extent := _extent(report, tz)) else "")
        )
    )
    text = (
        f"{title}: {_hours(usage.used_h)} of {_hours(usage.allocated_h)} GPU-h used"
        f" ({_percent(usage.efficiency)})."
    )
    return message(text, blocks)


def _whose(scope: Scope, label: Callable[[str], str]) -> str:
    """The scope as a header's plain text (a person by name when `label` knows it)."""
    match scope.kind:
        case ScopeKind.ME:
            return "Your use"
        case ScopeKind.USER:
            named = label(scope.name)
            return "One person's use" if named.startswith("<") else f"{named}'s use"
        case ScopeKind.TEAM:
            return f"Team {scope.name}"
        case ScopeKind.POOL:
            return f"Pool {scope.name}"
    return "The whole lab"


def _period(report: Report, tz: tzinfo) -> str:
    """ "last 7 days (Nov 25 - Dec 2)": the window's label and the days it covers, in `tz`."""
    first = report.window.since.astimezone(tz)
    last = (report.window.until - timedelta(microseconds=1)).astimezone(tz)
    fmt = "%b %-d" if first.year == last.year else "%b %-d, %Y"
    days = first.strftime(fmt) if first.date() == last.date() else f"{first:{fmt}} - {last:{fmt}}"
    return f"{report.window.label} ({days})"


def _figures(report: Report) -> list[str]:
    usage, figures = report.figures.usage, report.figures
    fields = [
        f"*Allocated*\n{_hours(usage.allocated_h)} GPU-h",
        f"*Used*\n{_hours(usage.used_h)} GPU-h",
        f"*Efficiency*\n{_percent(usage.efficiency)}",
        f"*Idle while allocated*\n{_hours(usage.idle_h)} GPU-h",
        f"*Unknown* (no readings)\n{_hours(usage.unknown_h)} GPU-h",
    ]
    if report.scope.kind in (ScopeKind.LAB, ScopeKind.POOL):
        fields.append(f"*Unreserved* (busy, no lease)\n{_hours(usage.unreserved_h)} GPU-h")
    if report.priced:
        fields.append(f"*Cost*\n{usage.cost:,.2f} {escape(report.currency)}")
    fields.append(f"*Wait for GPUs*\n{_waits(report)}")
    counts = figures.counts
    fields.append(
        f"*Reclaims · extensions · recalls*\n"
        f"{counts.reclaims} · {counts.extensions} · {counts.recalls}"
    )
    return fields


def _waits(report: Report) -> str:
    figures = report.figures
    if figures.wait_p50_s is None or figures.wait_p90_s is None:
        said = "no request was granted"
    else:
        granted = f"{figures.granted} granted"
        said = (
            f"median {_wait(figures.wait_p50_s)}, 90 % within {_wait(figures.wait_p90_s)} "
            f"({granted})"
        )
    if figures.still_waiting and figures.oldest_wait_s is not None:
        said += (
            f"; {figures.still_waiting} still waiting, the oldest for "
            f"{_wait(figures.oldest_wait_s)}"
        )
    return said


def _wait(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds < 60 else format_duration(timedelta(seconds=seconds))


def _breakdown(report: Report, label: Callable[[str], str]) -> list[Block]:
    if not report.lines or report.by is None:
        return []
    lines = sorted(report.lines, key=lambda line: (-line.usage.allocated_s, line.key))
    shown = [_line(line, report.by, label) for line in lines[:MAX_LINES]]
    title = _BY.get(report.by, "Breakdown")
    blocks = [section(f"*{title}*\n" + "\n".join(shown))]
    if len(lines) > MAX_LINES:
        blocks.append(context(f"…and {len(lines) - MAX_LINES} more."))
    return blocks


def _line(line: Line, by: str, label: Callable[[str], str]) -> str:
    usage = line.usage
    if not line.key:
        who = "_without a lease_"
    elif by == "holder":
        who = f"*{label(line.key)}*"
    else:
        who = f"*{escape(line.key)}*"
    figures = f"{_hours(usage.used_h)} of {_hours(usage.allocated_h)} GPU-h"
    if usage.allocated_s <= 0:
        figures = f"{_hours(usage.unreserved_h)} GPU-h busy without a lease"
    return f"`{bar(usage.efficiency)}`  {who}  {figures}"


def _nothing(  # noqa: PLR0917 - the report and how to show it, as report_message takes them
    report: Report,
    title: str,
    window_text: str,
    tz: tzinfo,
    label: Callable[[str], str],
    running: Sequence[LeaseView],
) -> Message:
    """No GPU use in the figures: a lease running now whose hours are not summed yet, else
    none at all (said so, with a longer window to try)."""
    extent = _extent(report, tz)
    if running and report.through is not None:  # the window reaches the hours not summed yet
        leases = " ".join(_not_yet(lease, report, tz) for lease in running)
        text = leases + (f"\n{extent}" if extent else "")
        return message(f"{title}: {leases}", [header(title), section(text)])
    longer = "30d" if window_text in _SHORT_WINDOWS else _month_before(report.window.since, tz)
    words = " ".join(filter(None, ["/gpu report", _scope_words(report.scope), longer]))
    text = (
        f"No GPU use {_whom(report.scope, label)} in this window. "
        + (f"{extent} " if extent else "")
        + f"A longer window may show some: `{words}`."
    )
    return message(f"{title}: no GPU use.", [header(title), section(text)])


def _extent(report: Report, tz: tzinfo) -> str | None:
    """How far the figures go when the window runs past the last hour summed, else None."""
    if report.through is None:
        return None
    to = _clock(report.through, report, tz)
    return f"Whole hours to {to} (this hour's use shows after it ends)."


def _not_yet(lease: LeaseView, report: Report, tz: tzinfo) -> str:
    """`Your lease L12 (2 GPUs since 09:10) will appear in reports after 10:00.`"""
    start = max(lease.granted_at, report.through or lease.granted_at)
    after = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    gpus = f"{len(lease.gpus)} GPU{'s' if len(lease.gpus) != 1 else ''}"
    since = _clock(lease.granted_at, report, tz)
    return (
        f"Your lease {lease.code} ({gpus} since {since}) will appear in reports after "
        f"{_clock(after, report, tz)}."
    )


def _clock(at: datetime, report: Report, tz: tzinfo) -> str:
    """A time in `tz`: the hour alone on the window's last day, else with its day."""
    local, last = (
        at.astimezone(tz),
        (report.window.until - timedelta(microseconds=1)).astimezone(tz),
    )
    return f"{local:%H:%M}" if local.date() == last.date() else f"{local:%a %-d %b %H:%M}"


def _day_by_day(report: Report) -> list[Block]:
    """A line a day for windows up to a month: allocated and used GPU-h and the efficiency
    bar, a dash for a day with nothing allocated; a few days a section (Slack's limits)."""
    if not report.days or report.window.until - report.window.since > MAX_DAILY:
        return []
    lines = [_day(day) for day in report.days]
    chunks = [lines[i : i + DAYS_A_SECTION] for i in range(0, len(lines), DAYS_A_SECTION)]
    first = "*Day by day* (GPU-h allocated, used)\n"
    return [section((first if n == 0 else "") + "\n".join(c)) for n, c in enumerate(chunks)]


def _day(day: Line) -> str:
    label = _day_label(day.key)
    usage = day.usage
    if usage.allocated_s <= 0:
        return f"`{label:<10} {'—':>8}`"
    figures = f"{_hours(usage.allocated_h):>8} {_hours(usage.used_h):>8}"
    return f"`{label:<10} {figures}  {bar(usage.efficiency)}`"


def _day_label(key: str) -> str:
    try:
        day = date.fromisoformat(key)
    except ValueError:
        return key
    return f"{day:%a} {day.day} {day:%b}"


def _whom(scope: Scope, label: Callable[[str], str]) -> str:
    match scope.kind:
        case ScopeKind.ME:
            return "by you"
        case ScopeKind.USER:
            return f"by {label(scope.name)}"
        case ScopeKind.TEAM:
            return f"by team {scope.name}"
        case ScopeKind.POOL:
            return f"in pool {scope.name}"
    return "in the lab"


def _scope_words(scope: Scope) -> str:
    if scope.kind in (ScopeKind.TEAM, ScopeKind.POOL):
        return f"{scope.kind} {scope.name}"
    return str(scope.kind) if scope.kind in (ScopeKind.ME, ScopeKind.LAB) else ""


def _month_before(since: datetime, tz: tzinfo) -> str:
    return (since.astimezone(tz) - timedelta(days=1)).strftime("%Y-%m")


def _hours(hours: float) -> str:
    return f"{hours:,.1f}"


def _percent(efficiency: float | None) -> str:
    return "–" if efficiency is None else f"{round(efficiency * 100)} %"
