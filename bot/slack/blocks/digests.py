"""The scheduled digests as Slack messages: the lab's period in a channel (figures, a text bar
per team, the leases that held most GPU time idle by code, team and pool, cost) and a person's
own period by DM."""

from __future__ import annotations

from datetime import timedelta

from bot.services.digests import IdleLease, LabDigest, PersonalDigest
from bot.slack.blocks.kit import (
    Block,
    Message,
    context,
    escape,
    header,
    message,
    section,
    slack_date,
)
from bot.slack.blocks.reports import bar
from rules.domain import format_duration
from rules.reports import Line, Report, Usage, Window

MAX_TEAMS = 15


def lab_digest(digest: LabDigest) -> Message:
    """ "GPU use, week of Nov 23": the lab's figures, each team's line, the idle leases."""
    report = digest.report
    usage = report.figures.usage
    title = f"GPU use, {report.window.label}"
    if usage.empty:
        text = f"{title}: no GPU was held or used in the {_span(digest.days)}."
        return message(text, [header(title), section(text)])
    summary = _summary(usage, report)
    blocks: list[Block] = [header(title), section(summary), context(_activity(report))]
    if report.lines:
        blocks.append(section("*By team*\n" + "\n".join(_line(line) for line in _shown(report))))
    if digest.idle:
        idle = "\n".join(_idle(lease) for lease in digest.idle)
        blocks.append(section("*Held but idle the most*\n" + idle))
    blocks.append(context(_footer(report.window, "`/gpu report lab` shows more.")))
    return message(f"{title}: {summary}", blocks)


def personal_digest(digest: PersonalDigest) -> Message:
    """ "Your GPUs last week: 41.0 GPU-h, 63 % efficiency ...", and a line per pool."""
    report = digest.report
    usage = report.figures.usage
    when = "last week" if digest.days == 7 else "in the last day"
    if usage.allocated_s <= 0:
        text = f"Your GPUs {when}: you held none." + _yours_waiting(report)
        return message(text, [section(text)])
    text = f"Your GPUs {when}: {_hours(usage.allocated_h)} GPU-h held, {_efficiency(usage)}"
    text += f", {_hours(usage.idle_h)} GPU-h of it idle"
    if usage.unknown_s > 0:
        text += f", {_hours(usage.unknown_h)} GPU-h with no readings"
    if report.priced:
        text += f"; cost {_cost(usage, report)}"
    text += "." + _yours_waiting(report)
    blocks: list[Block] = [section(text)]
    if len(report.lines) > 1:
        blocks.append(section("\n".join(_line(line) for line in _shown(report))))
    blocks.append(context(_footer(report.window, "`/gpu report me` shows more.")))
    return message(text, blocks)


def _summary(usage: Usage, report: Report) -> str:
    text = f"*{_hours(usage.allocated_h)} GPU-h* held, {_efficiency(usage)}"
    text += f"; {_hours(usage.idle_h)} GPU-h held idle"
    if usage.unknown_s > 0:
        text += f", {_hours(usage.unknown_h)} GPU-h with no readings (never counted as idle)"
    if usage.unreserved_s > 0:
        text += f"; {_hours(usage.unreserved_h)} GPU-h used without a lease"
    if report.priced:
        text += f". Cost: {_cost(usage, report)}"
    return text + "."


def _activity(report: Report) -> str:
    figures, counts = report.figures, report.figures.counts
    if figures.wait_p50_s is None or figures.wait_p90_s is None:
        waits = "No request was granted"
    else:
        waits = (
            f"{figures.granted} requests granted, after {_wait(figures.wait_p50_s)} "
            f"(median) and {_wait(figures.wait_p90_s)} (90 %)"
        )
    return (
        f"{waits}{_still_waiting(report)}. {counts.reclaims} reclaimed, "
        f"{counts.extensions} extended, {counts.recalls} recalled."
    )


def _still_waiting(report: Report) -> str:
    """ "; 2 still waiting, the oldest for 3h": requests of the period not granted yet."""
    figures = report.figures
    if not figures.still_waiting or figures.oldest_wait_s is None:
        return ""
    return f"; {figures.still_waiting} still waiting, the oldest for {_wait(figures.oldest_wait_s)}"


def _yours_waiting(report: Report) -> str:
    """ " 1 request of yours is still waiting, for 3h.": asked in the period, not granted."""
    figures = report.figures
    if not figures.still_waiting or figures.oldest_wait_s is None:
        return ""
    if figures.still_waiting == 1:
        return f" 1 request of yours is still waiting, for {_wait(figures.oldest_wait_s)}."
    return (
        f" {figures.still_waiting} requests of yours are still waiting, the oldest for "
        f"{_wait(figures.oldest_wait_s)}."
    )


def _shown(report: Report) -> list[Line]:
    return [line for line in report.lines if line.key and line.usage.allocated_s > 0][:MAX_TEAMS]


def _line(line: Line) -> str:
    usage = line.usage
    text = f"`{bar(usage.efficiency)}`  *{escape(line.key)}*  "
    return text + f"{_hours(usage.used_h)} of {_hours(usage.allocated_h)} GPU-h used"


def _idle(lease: IdleLease) -> str:
    """A lease by its code, team and pool: the channel sees no one's name."""
    usage = lease.usage
    return (
        f"• {lease.code} ({escape(lease.team)}, {escape(lease.pool)}): "
        f"{_hours(usage.idle_h)} of {_hours(usage.allocated_h)} GPU-h idle"
    )


def _footer(window: Window, more: str) -> str:
    since, until = slack_date(window.since), slack_date(window.until)
    return f"From the hourly usage records, {since} to {until}. {more}"


def _span(days: int) -> str:
    return "7 days" if days == 7 else "day"


def _efficiency(usage: Usage) -> str:
    if usage.efficiency is None:
        return "none of it used"
    return f"{round(usage.efficiency * 100)} % efficiency ({_hours(usage.used_h)} GPU-h used)"


def _cost(usage: Usage, report: Report) -> str:
    return f"{usage.cost:,.2f} {escape(report.currency)}"


def _hours(value: float) -> str:
    return f"{value:,.1f}"


def _wait(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds < 60 else format_duration(timedelta(seconds=seconds))
