"""The reports benchmark (python -m tests.bench.reports) at a tiny size, so that its generators,
its rollup and its report reads cannot rot."""

from __future__ import annotations

import pytest

from tests.bench import reports


def test_a_tiny_run_prints_every_figure_and_budget_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert 0 == reports.main(
        ["--days", "1", "--gpus", "16", "--hour-gpus", "16", "--report-days", "31"]
    )
    out = capsys.readouterr().out
    assert "(a) the rollup" in out
    assert "(c) a 30-day lab report" in out
    verdicts = [line for line in out.splitlines() if line.endswith(("PASS", "MISS"))]
    # the hour's rollup, then five report reads: the lab by team and built, a manager's team,
    # a member's own use, by lease
    assert 6 == len(verdicts)


def test_the_generated_minutes_roll_into_hours_that_add_up() -> None:
    """16 GPUs x 2 h: almost every minute stored (one in 211 is left out), leases on them, and
    hourly rows written."""
    figures = reports.bench_rollup(16, 2, use_postgres=False)
    assert 16 * 2 * 60 > figures.minutes > 16 * 2 * 60 * 0.98  # one in 211 never stored
    assert 0 < figures.written
    assert figures.leases > 0


def test_the_generated_hours_are_those_the_report_reads() -> None:
    rep = reports.bench_report(16, 31, use_postgres=False)
    assert rep.hourly > rep.in_window > 0
    assert ("", "nlp", "platform", "vision") == rep.teams  # "": unreserved use
    assert rep.requests > 0
