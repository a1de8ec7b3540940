"""The fairness benchmark's world: four teams with unequal nominals on two pools, the rule files
each policy runs under, and a seeded generator of borrow requests (Poisson arrivals per team
and pool, bursts, heavy-tailed durations, mixed sizes and priorities)."""

from __future__ import annotations

import math
import random
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import yaml

from rules.domain import Priority
from tests.builders import POLICIES

# pool -> (model, nodes, GPUs per node); team -> (nominal, borrowing_limit) per pool.
POOLS: dict[str, tuple[str, int, int]] = {
    "a100": ("NVIDIA A100-SXM4-80GB", 4, 8),
    "l40s": ("NVIDIA L40S", 4, 4),
}
QUOTAS: dict[str, dict[str, tuple[int, int]]] = {
    "a100": {"vision": (12, 8), "nlp": (10, 8), "speech": (6, 6), "platform": (4, 4)},
    "l40s": {"vision": (4, 4), "nlp": (4, 4), "speech": (6, 4), "platform": (2, 2)},
}
WEIGHTS = {"vision": 3.0, "nlp": 2.0, "speech": 2.0, "platform": 1.0}  # fair share
# Offered load per team as a multiple of its nominal: two teams want more than they are
# guaranteed, one less, so GPUs are lent, borrowed and recalled.
DEMAND = {"vision": 1.4, "nlp": 1.0, "speech": 0.6, "platform": 1.3}
MEMBERS = 4  # researchers per team
ADMIN = "U0ADMIN01"
MAX_DURATION = timedelta(days=3)  # limits.max_duration, as shipped
MAX_GPUS = 8  # limits.max_gpus_per_request, as shipped

# What a request asks for.
SIZES = (1, 1, 1, 1, 2, 2, 2, 4, 4, 8)
PRIORITIES = ((Priority.LOW, 0.2), (Priority.NORMAL, 0.65), (Priority.HIGH, 0.15))
MEDIAN_DURATION_H = 3.5
DURATION_SIGMA = 1.1  # lognormal: most jobs take hours, a few take days
MIN_DURATION = timedelta(minutes=15)
EARLY_SHARE = 0.45  # jobs that end before their lease does, and are released then
# Bursts: per team, episodes at this rate in which its arrivals come this many times as often.
BURSTS_PER_DAY = 0.4
BURST_FACTOR = 4.0
BURST_HOURS = (2.0, 6.0)

POLICY_NAMES = ("strict FIFO", "Kueue-like", "gpubot")


def member(team: str, k: int) -> str:
    return f"U0{team[:3].upper()}{k:04d}"


def manager(team: str) -> str:
    return f"U0{team[:3].upper()}MGR1"


def org_yaml() -> str:
    teams = {
        team: {
            "managers": [manager(team)],
            "members": [member(team, k) for k in range(MEMBERS)],
            "approval": "managers",
        }
        for team in WEIGHTS
    }
    return yaml.safe_dump({"admins": [ADMIN], "teams": teams}, sort_keys=False)


def pools_yaml() -> str:
    pools = {}
    for pool, (model, nodes, per_node) in POOLS.items():
        quotas = {
            team: {"nominal": nominal, "borrowing_limit": limit, "weight": WEIGHTS[team]}
            for team, (nominal, limit) in QUOTAS[pool].items()
        }
        pools[pool] = {
            "model": model,
            "nodes": {f"{pool}-node-{n + 1:02d}": per_node for n in range(nodes)},
            "quotas": quotas,
        }
    return yaml.safe_dump({"pools": pools}, sort_keys=False)


# What sets each policy apart: settings of limits.yaml (section, key) -> value.
SETTINGS: dict[str, dict[tuple[str, str], str]] = {
    # one strict queue per pool, no memory of past usage
    "strict FIFO": {("queue", "backfill"): "none", ("queue", "fair_share_half_life"): "0m"},
    # per-team queues that let heads that fit go; recall at once, as often as needed
    "Kueue-like": {
        ("queue", "backfill"): "best_effort",
        ("recall", "notice"): "0m",
        ("recall", "min_runtime"): "0m",
        ("recall", "cooldown"): "0m",
    },
    "gpubot": {},  # as shipped
}


def limits_yaml(policy: str) -> str:
    """The shipped limits.yaml with the settings that set `policy` apart, each changed in
    place (so the file keeps its comments and its YAML stays as admins write it)."""
    text = (POLICIES / "limits.yaml").read_text(encoding="utf-8")
    for (section, key), value in SETTINGS[policy].items():
        pattern = re.compile(rf"^({section}:\n(?:[ ]+.*\n|#.*\n|\n)*?[ ]+{key}:[ ]*)\S+", re.M)
        text, n = pattern.subn(rf"\g<1>{value}", text, count=1)
        assert n == 1, f"limits.yaml has no {section}.{key} to set"
    return text


def rules_dir(tmp: Path, policy: str) -> Path:
    """The shipped policies and their cases, with this world's org, pools and limits."""
    target = tmp / "rules"
    shutil.copytree(POLICIES, target)
    (target / "org.yaml").write_text(org_yaml(), encoding="utf-8")
    (target / "pools.yaml").write_text(pools_yaml(), encoding="utf-8")
    (target / "limits.yaml").write_text(limits_yaml(policy), encoding="utf-8")
    return target


def pool_size(pool: str) -> int:
    _, nodes, per_node = POOLS[pool]
    return nodes * per_node


# ---- the workload -----------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One borrow request and the work behind it."""

    at: datetime  # when it is asked for
    team: str
    user: str
    pool: str
    gpus: int
    duration: timedelta  # the lease asked for
    runs_for: timedelta  # how long the work runs once granted; shorter: released then
    priority: Priority

    @property
    def ends_early(self) -> bool:
        return self.runs_for < self.duration


def mean_gpu_hours(rng: random.Random, n: int = 4000) -> float:
    """What one request holds on average (a sample of the same distributions)."""
    total = 0.0
    for _ in range(n):
        _, runs_for = _durations(rng)
        total += min(rng.choice(SIZES), MAX_GPUS) * runs_for / timedelta(hours=1)
    return total / n


def _durations(rng: random.Random) -> tuple[timedelta, timedelta]:
    hours = rng.lognormvariate(math.log(MEDIAN_DURATION_H), DURATION_SIGMA)
    duration = max(MIN_DURATION, min(MAX_DURATION, timedelta(minutes=round(hours * 60))))
    if rng.random() < EARLY_SHARE:
        runs_for = timedelta(
            minutes=max(5, round(duration / timedelta(minutes=1) * rng.uniform(0.2, 0.95)))
        )
        return duration, min(runs_for, duration)
    return duration, duration


def _priority(rng: random.Random) -> Priority:
    roll = rng.random()
    for priority, share in PRIORITIES:
        if roll < share:
            return priority
        roll -= share
    return Priority.NORMAL


def _bursts(rng: random.Random, span_h: float) -> list[tuple[float, float]]:
    """(start, end) hours of one team's bursts."""
    out: list[tuple[float, float]] = []
    t = 0.0
    while True:
        t += rng.expovariate(BURSTS_PER_DAY / 24)
        if t >= span_h:
            return out
        out.append((t, min(span_h, t + rng.uniform(*BURST_HOURS))))


def _arrivals(
    rng: random.Random, rate_h: float, span_h: float, bursts: list[tuple[float, float]]
) -> list[float]:
    """Poisson arrivals at `rate_h` per hour, and more at (BURST_FACTOR - 1) x it in bursts."""
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_h)
        if t >= span_h:
            break
        times.append(t)
    for start, end in bursts:
        t = start
        while True:
            t += rng.expovariate(rate_h * (BURST_FACTOR - 1))
            if t >= end:
                break
            times.append(t)
    return sorted(times)


def generate(seed: int, start: datetime, span: timedelta, load: float = 1.0) -> list[Job]:
    """Requests over `span` from `start`, in order of arrival. Each team offers about
    DEMAND x its nominal x `load` GPU-hours per hour in each pool, bursts included."""
    rng = random.Random(seed)
    per_request = mean_gpu_hours(random.Random(seed + 1))
    span_h = span / timedelta(hours=1)
    burst_share = BURSTS_PER_DAY / 24 * sum(BURST_HOURS) / 2 * (BURST_FACTOR - 1)
    jobs: list[Job] = []
    for team in WEIGHTS:
        bursts = _bursts(rng, span_h)
        for pool in POOLS:
            nominal = QUOTAS[pool][team][0]
            rate_h = DEMAND[team] * nominal * load / per_request / (1 + burst_share)
            for hour in _arrivals(rng, rate_h, span_h, bursts):
                duration, runs_for = _durations(rng)
                jobs.append(
                    Job(
                        at=start + timedelta(minutes=round(hour * 60, 2)),
                        team=team,
                        user=member(team, rng.randrange(MEMBERS)),
                        pool=pool,
                        gpus=min(rng.choice(SIZES), MAX_GPUS, pool_size(pool)),
                        duration=duration,
                        runs_for=runs_for,
                        priority=_priority(rng),
                    )
                )
    jobs.sort(key=lambda j: (j.at, j.team, j.pool))
    return jobs
