"""A report as files: the chart (a real PNG from matplotlib), the CSV and the text bars, each
checked against figures worked out by hand."""

from __future__ import annotations

import struct
import sys
from dataclasses import replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from bot.services import charts
from rules.reports import Counts, Figures, Line, Report, Scope, ScopeKind, Usage, Window

H = 3600.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BERLIN = ZoneInfo("Europe/Berlin")


def a_report(*, priced: bool = True, days: int = 3) -> Report:
    """Team vision over 3 days: 2 GPUs x 5 h a day allocated, used at 50 %, 75 %, none; Alice
    holds 20 GPU-h of it, Bob 10; $2.50 per GPU-hour."""
    used = [5.0, 7.5, 0.0]
    per_day = tuple(
        Line(
            f"2026-11-{24 + i}",
            Usage(allocated_s=10 * H, used_s=used[i] * H, idle_s=(10 - used[i]) * H, cost=25.0),
        )
        for i in range(days)
    )
    total = Usage(allocated_s=30 * H, used_s=12.5 * H, idle_s=17.5 * H, unknown_s=0.0, cost=75.0)
    return Report(
        scope=Scope(ScopeKind.TEAM, "vision"),
        window=Window(
            datetime(2026, 11, 23, 23, tzinfo=UTC), datetime(2026, 11, 26, 23, tzinfo=UTC), "3d"
        ),
        figures=Figures(total, 60.0, 300.0, 4, Counts(1, 2, 0)),
        lines=(
            Line("U0ALICE01", Usage(allocated_s=20 * H, used_s=10 * H, cost=50.0)),
            Line("U0BOB0001", Usage(allocated_s=10 * H, used_s=2.5 * H, unreserved_s=H, cost=25.0)),
        ),
        by="holder",
        days=per_day,
        currency="USD",
        priced=priced,
    )


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which follows the signature."""
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_chart_is_a_1000_by_500_png_and_the_same_report_gives_the_same_bytes() -> None:
    """Drawn twice, byte for byte the same: no time or software name in the file."""
    first = charts.png(a_report(), tz=BERLIN)
    assert first is not None
    assert PNG_SIGNATURE == first[:8]
    assert (1000, 500) == png_size(first)
    assert first == charts.png(a_report(), tz=BERLIN)
    assert b"Software" not in first
    assert b"tIME" not in first


def test_the_chart_differs_when_the_figures_do() -> None:
    """A chart that did not draw the days would be the same for any report."""
    assert charts.png(a_report(), tz=BERLIN) != charts.png(a_report(days=2), tz=BERLIN)


def test_a_month_and_an_empty_window_are_drawn_too() -> None:
    """Thirty days get short upright labels; a window without GPU time says so."""
    report = a_report()
    month = tuple(
        Line(f"2026-11-{d:02d}", Usage(allocated_s=d * H, used_s=d * H / 2)) for d in range(1, 31)
    )
    for days in (month, ()):
        drawn = charts.png(replace(report, days=days), tz=UTC)
        assert drawn is not None
        assert PNG_SIGNATURE == drawn[:8]


def test_without_matplotlib_there_is_no_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `reports` extra missing: the import fails, and the caller shows text bars."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert charts.png(a_report(), tz=BERLIN) is None


def test_the_csv_has_a_header_the_total_each_person_and_each_day() -> None:
    """Hand-checked: 30 GPU-h allocated, 12.5 used (41.7 %), $75; Alice 20 at 50 %; Bob 10
    at 25 % with 1 GPU-h unreserved; the days at 50 %, 75 % and 0 %."""
    expected = (
        "section,key,name,allocated_gpu_h,used_gpu_h,idle_gpu_h,unknown_gpu_h,"
        "unreserved_gpu_h,efficiency_pct,cost_usd\n"
        "total,,,30.00,12.50,17.50,0.00,0.00,41.7,75.00\n"
        "holder,U0ALICE01,Alice Anders,20.00,10.00,0.00,0.00,0.00,50.0,50.00\n"
        "holder,U0BOB0001,Bob Berg,10.00,2.50,0.00,0.00,1.00,25.0,25.00\n"
        "day,2026-11-24,2026-11-24,10.00,5.00,5.00,0.00,0.00,50.0,25.00\n"
        "day,2026-11-25,2026-11-25,10.00,7.50,2.50,0.00,0.00,75.0,25.00\n"
        "day,2026-11-26,2026-11-26,10.00,0.00,10.00,0.00,0.00,0.0,25.00\n"
    )
    names = {"U0ALICE01": "Alice Anders", "U0BOB0001": "Bob Berg"}
    assert expected == charts.csv(a_report(), names=names)


def test_an_unpriced_csv_leaves_the_cost_empty_and_no_gpu_time_no_efficiency() -> None:
    """No price in pools.yaml: an empty cost column; a day with nothing allocated has no
    efficiency (not 0 %)."""
    report = a_report(priced=False)
    idle_day = Line("2026-11-27", Usage())
    shown = charts.csv(replace(report, days=(idle_day,), lines=()))
    assert [
        "section,key,name,allocated_gpu_h,used_gpu_h,idle_gpu_h,unknown_gpu_h,"
        "unreserved_gpu_h,efficiency_pct,cost",
        "total,,,30.00,12.50,17.50,0.00,0.00,41.7,",
        "day,2026-11-27,2026-11-27,0.00,0.00,0.00,0.00,0.00,,",
    ] == shown.splitlines()


def test_text_bars_scale_to_the_busiest_day_with_the_used_part_solid() -> None:
    """10 GPU-h each day fill 20 characters; 5 used is 10 solid, 7.5 used is 15."""
    assert [
        "Tue 24 Nov " + "█" * 10 + "░" * 10 + " 10.0 GPU-h allocated, 5.0 used (50 %)",
        "Wed 25 Nov " + "█" * 15 + "░" * 5 + " 10.0 GPU-h allocated, 7.5 used (75 %)",
        "Thu 26 Nov " + "░" * 20 + " 10.0 GPU-h allocated, 0.0 used (0 %)",
    ] == charts.text_bars(a_report()).splitlines()
    empty = replace(a_report(), days=())
    assert "No GPU time in this window." == charts.text_bars(empty)


@pytest.mark.parametrize(
    ("scope", "window", "fmt", "expected"),
    [
        (Scope(ScopeKind.TEAM, "vision"), "7d", "png", "gpubot-report-team-vision-7d.png"),
        (Scope(ScopeKind.LAB), "2026-11", "csv", "gpubot-report-lab-2026-11.csv"),
        (Scope(ScopeKind.POOL, "a100"), "", "png", "gpubot-report-pool-a100-7d.png"),
        (Scope(ScopeKind.ME, "U0ALICE01"), "30d", "png", "gpubot-report-me-30d.png"),
    ],
)
def test_file_names_say_the_scope_and_the_window(
    scope: Scope, window: str, fmt: charts.FileFormat, expected: str
) -> None:
    assert expected == charts.filename(scope, window, fmt)


def test_the_title_names_the_subject_and_the_days_in_the_readers_zone() -> None:
    """23 Nov 23:00 UTC is 24 Nov in Berlin; the window ends at midnight, so 26 Nov is last."""
    assert "GPU use of team vision, 3d (24 Nov to 26 Nov 2026)" == charts.title(
        a_report(), "team vision", BERLIN
    )
