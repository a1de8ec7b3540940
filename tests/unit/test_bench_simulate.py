"""The simulation benchmark (python -m tests.bench.simulate) on a day of a tiny lab, so that its
generator and its figures cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import simulate


def test_the_generated_history_is_replayed_whole(tmp_path: Path) -> None:
    """Every GPU has every minute; every lease and request of the day is replayed."""
    size, took, _, sim = simulate.run(f"sqlite:///{tmp_path / 'bench.db'}", gpus=16, days=1)
    assert (16, 16 * 1440) == (size.gpus, size.minutes)
    assert size.leases > 0
    assert (size.requests, size.leases) == (sim.summary.requests, sim.summary.leases)
    assert 0 == sim.summary.not_replayed
    assert took > 0


def test_the_benchmark_prints_ours_the_budget_and_the_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert 0 == simulate.main(["--gpus", "8", "--days", "1"])
    out = capsys.readouterr().out
    assert "8 GPUs x 1 day: 11,520 minute rows" in out
    assert "1,000 GPUs x 30 days (extrapolated)" in out
    assert "ratio" in out
