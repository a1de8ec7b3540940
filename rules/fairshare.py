"""Fair share among borrowers: each team's weight against its decayed past usage.

As in Slurm's fair-share, past GPU-hours count less the longer ago they were used: an hour
that ended `a` ago counts 2 ** (-a / half_life). A team's key is the share of the pool's recent
usage it had over the share of the pool's weights it is owed; the lower key is served first, so
a team that used less than its share goes ahead of one that used more. The queue orders the
heads of teams waiting beyond their nominal by this key (see rules/README.md, "Fair sharing").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from rules.policy import Quota

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Interval:
    """GPUs a team held from `start` to `end` (None: still held)."""

    team: str
    gpus: int
    start: datetime
    end: datetime | None


def decayed_usage(
    intervals: Iterable[Interval], now: datetime, half_life: timedelta
) -> dict[str, float]:
    """GPU-hours per team, each instant weighted by 2 ** (-age / half_life), integrated in
    closed form over each interval clipped at `now`. A zero half-life (fair share off): {}."""
    if half_life <= timedelta(0):
        return {}
    rate = decay_rate(half_life)
    usage: dict[str, float] = {}
    for interval in intervals:
        end = now if interval.end is None else min(interval.end, now)
        start = min(interval.start, end)
        older = (now - start) / HOUR  # hours since the interval began
        newer = (now - end) / HOUR  # hours since it ended (0: it runs on)
        hours = (math.exp(-rate * newer) - math.exp(-rate * older)) / rate
        usage[interval.team] = usage.get(interval.team, 0.0) + interval.gpus * hours
    return usage


def decay_rate(half_life: timedelta) -> float:
    """The decay per hour of a positive half-life: ln 2 over the half-life in hours."""
    return math.log(2) / (half_life / HOUR)


@dataclass(frozen=True)
class Share:
    """One team's fair share in a pool: what it is owed (`weight_share`) against what it used
    recently (`usage_share`, of the decayed GPU-hours of the pool's teams)."""

    team: str
    weight: float
    weight_share: float  # the team's weight over the sum of the pool's weights
    usage: float  # decayed GPU-hours
    usage_share: float  # the team's usage over the pool's teams' usage; 0 when nobody used any

    @property
    def key(self) -> float:
        """Lower is served first: below 1 the team used less than it is owed."""
        return self.usage_share / self.weight_share if self.weight_share else math.inf


def shares(quotas: Mapping[str, Quota], usage: Mapping[str, float]) -> dict[str, Share]:
    """The fair share of every team with a quota in the pool; `usage` from `decayed_usage`
    (a team without a quota there is not counted in the pool's total)."""
    weights = sum(q.weight for q in quotas.values())
    total = sum(usage.get(team, 0.0) for team in quotas)
    return {
        team: Share(
            team=team,
            weight=quota.weight,
            weight_share=quota.weight / weights if weights else 0.0,
            usage=usage.get(team, 0.0),
            usage_share=usage.get(team, 0.0) / total if total else 0.0,
        )
        for team, quota in quotas.items()
    }
