"""The scale benchmark (python -m tests.bench.scale) at a tiny size, so that its fleet builder,
its sweep, ingest and command timings and its printing cannot rot."""

from __future__ import annotations

import pytest

from tests.bench import scale
from tests.support import postgres


def test_a_tiny_run_prints_every_figure_and_budget_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--fleets", "100", "200", "--small", "100", "--compared", "200", "--sqlite-only"]
    quick = ["--ingest-s", "1", "--command-runs", "1", "--rss-burst", "0", "--no-audit"]
    assert 0 == scale.main([*argv, *quick])
    out = capsys.readouterr().out
    assert "one sweep of 200 GPUs" in out
    assert "sweep, 2x the fleet" in out
    for command in ("status", "borrow", "release", "mine", "why"):
        assert f"sqlite: {command} " in out
    verdicts = [line for line in out.splitlines() if line.endswith(("PASS", "MISS"))]
    assert 4 + 5 <= len(verdicts)  # sweep, ingest (2), scaling; five commands


def test_every_subject_of_a_sweep_is_decided_and_most_from_the_memo() -> None:
    with scale.fleet("sqlite", 200, None) as f:
        sweep = scale.bench_sweep(f)
        ingest = scale.bench_ingest(f, seconds=1.0)
    assert 200 + 100 == sweep.decided  # every GPU, and the leases of GPUs 0-3 of each node
    assert 0 < sweep.evaluated < sweep.decided
    assert {200: ingest.offered} == dict(ingest.statuses)


@pytest.mark.postgres
def test_a_tiny_fleet_measures_on_postgres(postgres_server: postgres.PostgresServer) -> None:
    row = scale.measure_fleet(
        "postgres", 100, postgres_server, commands=True, ingest_s=1.0, command_runs=1
    )
    assert row.nodes * 8 + row.nodes * 4 == row.sweep.decided  # GPUs, and leases of GPUs 0-3
    assert row.commands is not None
    assert all(seconds > 0 for seconds in row.commands.values())


def test_the_sweep_only_run_prints_wall_and_cpu_and_the_budget_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert 0 == scale.main(["--sweep-only", "--sqlite-only", "--fleets", "100", "200"])
    out = capsys.readouterr().out
    assert "sqlite: one sweep of 200 GPUs" in out
    assert "sqlite: sweep CPU, 2x the fleet" in out
    assert "scrape" not in out  # the sweep alone


def test_the_commands_only_run_prints_wall_and_cpu_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each command's wall and CPU ratio between the two fleets, and nothing else."""
    argv = ["--commands-only", "--sqlite-only", "--small", "100", "--compared", "200"]
    assert 0 == scale.main([*argv, "--command-runs", "1"])
    out = capsys.readouterr().out
    for command in ("status", "borrow", "release", "mine", "why"):
        assert f"sqlite: {command} wall " in out
        assert f"sqlite: {command} cpu " in out
    assert "sweep" not in out  # the commands alone
