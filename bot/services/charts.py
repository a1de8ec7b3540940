"""A report as files: a chart (PNG, drawn by matplotlib when the `reports` extra is installed),
its figures as CSV, and the text bars shown where no chart can be drawn; and owing one of them,
shared where it was asked for, to the outbox.

The chart is deterministic: the same report gives the same bytes (one bundled font, no time or
software name written into the file), so a file shared again after a crash is the same file.
"""

from __future__ import annotations

import csv as csv_module
import io
import re
import threading
from collections.abc import Mapping
from datetime import UTC, date, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Literal

from bot.services import reports
from bot.services.context import Context
from bot.services.results import Refused
from rules.reports import GroupBy, Line, Report, Scope, ScopeKind, Usage, Window
from storage import outbox
from storage.outbox import OutboxKind, Owed

if TYPE_CHECKING:
    from matplotlib.axes import Axes

FileFormat = Literal["png", "csv"]
FORMATS: tuple[FileFormat, ...] = ("png", "csv")
NO_CHARTS = "Charts need the `reports` extra (pip install 'gpubot[reports]'); here are text bars."
WIDTH_PX, HEIGHT_PX, DPI = 1000, 500, 100
ALLOCATED, USED, EFFICIENCY = "#9ecae1", "#2171b5", "#e6550d"
FONT = "DejaVu Sans"  # bundled with matplotlib: the same glyphs on every machine
_INSTANT = timedelta(microseconds=1)
_drawing = threading.Lock()  # matplotlib's font cache and text layout are shared state


def label(scope: Scope, names: Mapping[str, str] | None = None) -> str:
    """What the report is about, in words: "team vision", "Alice Anders", "the lab"."""
    who = (names or {}).get(scope.name, scope.name)
    match scope.kind:
        case ScopeKind.LAB:
            return "the lab"
        case ScopeKind.TEAM:
            return f"team {scope.name}"
        case ScopeKind.POOL:
            return f"pool {scope.name}"
        case _:
            return who or "you"


def filename(scope: Scope, window: str, fmt: FileFormat) -> str:
    """gpubot-report-team-vision-7d.png: the scope, the window as asked for, the format."""
    name = "" if scope.kind in (ScopeKind.LAB, ScopeKind.ME) else scope.name
    parts = [str(scope.kind), name, window or "7d"]
    slug = "-".join(_slug(part) for part in parts if _slug(part))
    return f"gpubot-report-{slug}.{fmt}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def title(report: Report, about: str, tz: tzinfo = UTC) -> str:
    """GPU use of team vision, last 7 days (24 Nov to 1 Dec 2026)."""
    since = report.window.since.astimezone(tz).date()
    until = (report.window.until - _INSTANT).astimezone(tz).date()  # the last day shown
    return f"GPU use of {about}, {report.window.label} ({_span(since, until)})"


def _span(since: date, until: date) -> str:
    start = f"{since.day} {since:%b}" if since.year == until.year else f"{since:%d %b %Y}"
    return f"{start} to {until.day} {until:%b %Y}"


# ---- the chart -----------------------------------------------------------------------------


def png(report: Report, *, tz: tzinfo, about: str = "") -> bytes | None:
    """The chart: per day, allocated and used GPU-hours side by side and the efficiency line,
    about 1000x500 px. None when matplotlib is not installed (the `reports` extra)."""
    try:
        import matplotlib  # noqa: PLC0415  (optional: the `reports` extra)
    except ImportError:
        return None
    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    heading = title(report, about or label(report.scope), tz)
    with (
        _drawing,
        matplotlib.rc_context(
            {
                "font.family": "sans-serif",
                "font.sans-serif": [FONT],
                "axes.spines.top": False,
                "axes.spines.right": False,
                "axes.grid": True,
                "axes.grid.axis": "y",
                "grid.color": "#e5e5e5",
                "axes.axisbelow": True,
                "svg.hashsalt": "gpubot",
            }
        ),
    ):
        figure = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        _bars(axes, report.days)
        axes.set_title(heading, loc="left", fontsize=13, fontweight="bold")
        figure.tight_layout()
        out = io.BytesIO()
        figure.savefig(out, format="png", dpi=DPI, metadata=_NO_METADATA)
    return out.getvalue()


_NO_METADATA: dict[str, Any] = {"Software": None}


def _bars(axes: Axes, days: tuple[Line, ...]) -> None:
    positions = list(range(len(days)))
    allocated = [day.usage.allocated_h for day in days]
    used = [day.usage.used_h for day in days]
    width = 0.38
    axes.bar(
        [p - width / 2 for p in positions],
        allocated,
        width,
        color=ALLOCATED,
        label="allocated GPU-h",
    )
    axes.bar([p + width / 2 for p in positions], used, width, color=USED, label="used GPU-h")
    many = len(days) > 10  # a month: short labels, upright
    axes.set_xticks(positions, [_day_label(day.key, short=many) for day in days])
    if many:
        axes.tick_params(axis="x", labelrotation=90, labelsize=8)
    axes.set_ylabel("GPU-hours")
    axes.set_ylim(bottom=0, top=max([*allocated, *used, 1.0]) * 1.15)
    if not any(day.usage.allocated_s > 0 for day in days):
        axes.text(0.5, 0.5, "No GPU time in this window", ha="center", transform=axes.transAxes)
    share = axes.twinx()
    share.spines["right"].set_visible(True)
    share.grid(visible=False)
    points = [
        (p, 100 * e)
        for p, day in zip(positions, days, strict=True)
        if (e := day.usage.efficiency) is not None
    ]
    share.plot(
        [p for p, _ in points],
        [e for _, e in points],
        color=EFFICIENCY,
        marker="o",
        linewidth=2,
        label="efficiency (used / allocated)",
    )
    share.set_ylim(0, 105)
    share.set_ylabel("efficiency, %")
    handles = axes.get_legend_handles_labels()
    line = share.get_legend_handles_labels()
    axes.legend(
        handles[0] + line[0],
        handles[1] + line[1],
        loc="upper left",
        frameon=False,
        ncols=3,
        fontsize=9,
    )


def _day_label(key: str, *, short: bool = False) -> str:
    try:
        day = date.fromisoformat(key)
    except ValueError:
        return key
    return f"{day.day} {day:%b}" if short else f"{day:%a} {day.day} {day:%b}"


# ---- the CSV and the text bars --------------------------------------------------------------


def csv(report: Report, *, names: Mapping[str, str] | None = None, zone: str = "") -> str:
    """A header, the total, a row per breakdown line, a row per day: plain numbers (GPU-hours
    to 2 places, efficiency in percent to 1, cost to 2; empty when there is none). A day's
    name says the time zone its dates are in, when `zone` is given."""
    out = io.StringIO()
    writer = csv_module.writer(out, lineterminator="\n")
    cost = f"cost_{report.currency.lower()}" if report.priced else "cost"
    writer.writerow(
        [
            "section",
            "key",
            "name",
            "allocated_gpu_h",
            "used_gpu_h",
            "idle_gpu_h",
            "unknown_gpu_h",
            "unreserved_gpu_h",
            "efficiency_pct",
            cost,
        ]
    )
    shown = names or {}
    writer.writerow(_row("total", "", "", report.figures.usage, report.priced))
    for line in report.lines:
        name = shown.get(line.key, line.key)
        writer.writerow(_row(str(report.by or "line"), line.key, name, line.usage, report.priced))
    for day in report.days:
        shown_day = f"{day.key} ({zone})" if zone else day.key
        writer.writerow(_row("day", day.key, shown_day, day.usage, report.priced))
    return out.getvalue()


def _row(section: str, key: str, name: str, usage: Usage, priced: bool) -> list[str]:
    efficiency = usage.efficiency
    return [
        section,
        key,
        name,
        f"{usage.allocated_h:.2f}",
        f"{usage.used_h:.2f}",
        f"{usage.idle_h:.2f}",
        f"{usage.unknown_h:.2f}",
        f"{usage.unreserved_h:.2f}",
        f"{100 * efficiency:.1f}" if efficiency is not None else "",
        f"{usage.cost:.2f}" if priced else "",
    ]


def text_bars(report: Report, *, width: int = 20) -> str:
    """A line per day: a bar as long as its allocated GPU-hours (the longest day fills
    `width`), the used part solid, then the figures."""
    if not report.days:
        return "No GPU time in this window."
    top = max(day.usage.allocated_h for day in report.days) or 1.0
    lines = []
    for day in report.days:
        usage = day.usage
        allocated = round(width * usage.allocated_h / top)
        used = min(allocated, round(width * usage.used_h / top))
        bar = "█" * used + "░" * (allocated - used) + " " * (width - allocated)
        efficiency = f" ({100 * usage.efficiency:.0f} %)" if usage.efficiency is not None else ""
        lines.append(
            f"{_day_label(day.key):<10} {bar} {usage.allocated_h:.1f} GPU-h allocated, "
            f"{usage.used_h:.1f} used{efficiency}"
        )
    return "\n".join(lines)


# ---- owing a file ---------------------------------------------------------------------------


def owe_file(
    ctx: Context,
    viewer: str,
    scope: Scope,
    window: Window,
    *,
    fmt: FileFormat,
    channel: str,
    asked: str = "",
    by: GroupBy | None = None,
) -> Refused | None:
    """Owe `viewer` the report as a file shared in `channel` (a conversation id, or a person's
    id for their DM with the bot), the same row *Chart* and *CSV* owe, with this exact window.
    Refused at once when they may not see it; the deliverer asks again when it draws the file
    (a refusal then goes to the viewer). `asked`: the window as typed ("7d"), for the name."""
    seen = reports.build(ctx, viewer, scope, window, by=by)
    if isinstance(seen, Refused):
        return seen
    data = {
        "viewer": viewer,
        "scope": str(scope.kind),
        "name": scope.name,
        "window": asked or window.label,
        "label": window.label,
        "since": window.since.isoformat(),
        "until": window.until.isoformat(),
        "format": fmt,
        "channel": channel,
        "by": by,
    }
    subject = f"report:{scope.kind}:{scope.name}:{data['window']}"
    with ctx.db.write() as session:
        outbox.owe(session, Owed(OutboxKind.REPORT_FILE, subject, viewer, data), at=ctx.now())
    return None
