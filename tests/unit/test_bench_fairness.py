"""The fairness benchmark (python -m tests.bench.fairness) on a few hours of its workload, so
that its generator, its rule files and its replay through the use cases cannot rot."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from bot.services.rule_files import read_rules_dir
from rules.loader import load_policy
from rules.policy import Backfill
from tests.bench import fairness, fairness_workload
from tests.bench.fairness_workload import POLICY_NAMES

HOURS = timedelta(hours=6)


def test_the_workload_is_seeded_and_within_the_pools_limits() -> None:
    jobs = fairness_workload.generate(7, fairness.START, timedelta(days=2))
    assert jobs == fairness_workload.generate(7, fairness.START, timedelta(days=2))
    assert jobs != fairness_workload.generate(8, fairness.START, timedelta(days=2))
    assert [j.at for j in jobs] == sorted(j.at for j in jobs)
    assert {j.team for j in jobs} == set(fairness_workload.WEIGHTS)
    assert {j.pool for j in jobs} == set(fairness_workload.POOLS)
    for job in jobs:
        assert 1 <= job.gpus <= fairness_workload.MAX_GPUS
        assert fairness_workload.MIN_DURATION <= job.duration <= fairness_workload.MAX_DURATION
        assert timedelta(0) < job.runs_for <= job.duration


@pytest.mark.parametrize(
    ("policy", "backfill", "half_life", "notice"),
    [
        pytest.param(p, *settings, id=p)
        for p, *settings in (
            ("strict FIFO", Backfill.NONE, timedelta(0), timedelta(minutes=30)),
            ("Kueue-like", Backfill.BEST_EFFORT, timedelta(days=7), timedelta(0)),
            ("gpubot", Backfill.RESERVE, timedelta(days=7), timedelta(minutes=30)),
        )
    ],
)
def test_each_policy_is_chosen_by_its_rule_files_alone(
    tmp_path: Path,
    policy: str,
    backfill: Backfill,
    half_life: timedelta,
    notice: timedelta,
) -> None:
    loaded = load_policy(read_rules_dir(fairness_workload.rules_dir(tmp_path, policy)))
    assert (backfill, half_life, notice) == (
        loaded.queue.backfill,
        loaded.queue.fair_share_half_life,
        loaded.recall.notice,
    )
    assert {"vision", "nlp", "speech", "platform"} == set(loaded.teams)
    assert 2.0 == loaded.pools["a100"].quotas["nlp"].weight


def test_a_few_hours_replayed_under_each_policy_report_every_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs = fairness_workload.generate(fairness.SEED, fairness.START, HOURS)
    figures = fairness.compare(jobs, HOURS, fairness.TICK, parallel=False)
    assert list(POLICY_NAMES) == [f.policy for f in figures]
    for f in figures:
        assert len(jobs) == f.requests
        assert f.granted + f.denied + f.waiting_at_end + f.timed_out <= f.requests
        assert 0 < f.allocation_pct <= 100
        assert f.granted == len(f.guarantee_waits_min) + sum(map(len, f.other_waits_min.values()))
        assert f.sweeps > 0
    fairness.report(figures, jobs, HOURS, fairness.TICK)
    out = capsys.readouterr().out
    assert f"Workload: {len(jobs):,} requests" in out
    verdicts = [line for line in out.splitlines() if line.endswith(("PASS", "MISS"))]
    assert 4 == len(verdicts)


def test_skipping_idle_stretches_changes_no_figure() -> None:
    """The sweep job skipped while nothing waits and no lease nears its end: the same run as
    with a sweep on every tick, in fewer passes."""
    jobs = fairness_workload.generate(fairness.SEED, fairness.START, HOURS)
    every = fairness.run_policy("gpubot", jobs, HOURS, fairness.TICK, skip_idle=False)
    skipping = fairness.run_policy("gpubot", jobs, HOURS, fairness.TICK)
    assert skipping.sweeps < every.sweeps
    for f in (every, skipping):
        f.sweeps, f.seconds = 0, 0.0
    assert every == skipping


@pytest.mark.parametrize(
    ("shares", "index"),
    [([3.0, 3.0, 3.0, 3.0], 1.0), ([4.0, 0.0, 0.0, 0.0], 0.25), ([2.0, 1.0], 0.9), ([], 1.0)],
)
def test_jains_index(shares: list[float], index: float) -> None:
    assert index == pytest.approx(fairness.jain(shares))
