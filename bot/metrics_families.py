"""/metrics: the families of figures, built from what the database said at one scrape.

Labels name pools, teams, nodes, states, reasons and outcomes, never a person."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from bot.metrics_text import ManySamples
from rules.policy import Policy
from storage import metrics as figures


def fleet(policy: Policy, found: figures.Fleet) -> Iterable[Metric]:
    gpus = GaugeMetricFamily(
        "gpubot_gpus",
        "GPUs by pool and where they stand: free, leased, occupied (in use without a lease), "
        "silent (not reporting), drained, unhealthy, unknown",
        labels=["pool", "state"],
    )
    unreserved = GaugeMetricFamily(
        "gpubot_unreserved_gpus", "GPUs in use without a lease, by pool", labels=["pool"]
    )
    occupied = dict.fromkeys(policy.pools, 0)
    for (pool, state), count in sorted(found.states.items()):
        gpus.add_metric([pool, state], count)
        if state == "occupied":
            occupied[pool] = occupied.get(pool, 0) + count
    for pool, count in sorted(occupied.items()):
        unreserved.add_metric([pool], count)
    nodes = GaugeMetricFamily(
        "gpubot_nodes",
        "Nodes by pool and reporting state (reporting, silent, unknown)",
        labels=["pool", "reporting"],
    )
    by_state: dict[tuple[str, str], int] = {}
    ages = ManySamples(
        "gpubot_node_telemetry_age_seconds",
        "Seconds since telemetry last profiled a GPU of the node (written at least every 5 "
        "minutes while samples arrive); nodes never heard from have no series",
        labels=["node", "pool"],
    )
    for node in found.nodes:
        key = (node.pool, node.reporting)
        by_state[key] = by_state.get(key, 0) + 1
    heard = [node for node in found.nodes if node.telemetry_age_s is not None]
    ages.columns = [[node.name for node in heard], [node.pool for node in heard]]
    # Milliseconds: the database's arithmetic on times leaves microsecond dust.
    ages.values = [max(0.0, round(float(node.telemetry_age_s or 0), 3)) for node in heard]
    for (pool, reporting), count in sorted(by_state.items()):
        nodes.add_metric([pool, reporting], count)
    yield from (gpus, unreserved, nodes, ages)


def quotas(policy: Policy, held: Mapping[tuple[str, str], int]) -> Iterable[Metric]:
    labels = ["pool", "team"]
    nominal = GaugeMetricFamily(
        "gpubot_quota_nominal_gpus", "The team's guaranteed GPUs in the pool", labels=labels
    )
    limit = GaugeMetricFamily(
        "gpubot_quota_borrowing_limit_gpus",
        "How many GPUs beyond nominal the team may borrow in the pool",
        labels=labels,
    )
    lending = GaugeMetricFamily(
        "gpubot_quota_lending_limit_gpus",
        "How many of its unused nominal GPUs the team lends to others in the pool",
        labels=labels,
    )
    used = GaugeMetricFamily(
        "gpubot_quota_used_gpus", "GPUs the team holds in active leases in the pool", labels=labels
    )
    borrowed = GaugeMetricFamily(
        "gpubot_quota_borrowed_gpus",
        "GPUs the team holds beyond its nominal in the pool",
        labels=labels,
    )
    keys = {(p, t) for p, pool in policy.pools.items() for t in pool.quotas} | set(held)
    for pool, team in sorted(keys):
        quota = policy.pools[pool].quotas.get(team) if pool in policy.pools else None
        holds = held.get((pool, team), 0)
        if quota is not None:
            nominal.add_metric([pool, team], quota.nominal)
            limit.add_metric([pool, team], quota.borrowing_limit)
            lending.add_metric([pool, team], quota.lending_limit)
        used.add_metric([pool, team], holds)
        borrowed.add_metric([pool, team], max(0, holds - (quota.nominal if quota else 0)))
    yield from (nominal, limit, lending, used, borrowed)


def waiting(policy: Policy, waits: list[figures.Waiting], now: datetime) -> Iterable[Metric]:
    queued = GaugeMetricFamily(
        "gpubot_queue_length", "Requests queued for GPUs, by pool", labels=["pool"]
    )
    queued_wait = GaugeMetricFamily(
        "gpubot_queue_oldest_wait_seconds",
        "How long the oldest queued request has waited, by pool (0: nothing waits)",
        labels=["pool"],
    )
    pending = GaugeMetricFamily(
        "gpubot_approvals_pending", "Requests waiting for a person's approval", labels=["pool"]
    )
    pending_wait = GaugeMetricFamily(
        "gpubot_approvals_oldest_wait_seconds",
        "How long the oldest request waiting for approval has waited, by pool",
        labels=["pool"],
    )
    found = {(w.pool, w.state): w for w in waits}
    for pool in sorted(set(policy.pools) | {w.pool for w in waits}):
        for state, count, wait in (
            ("queued", queued, queued_wait),
            ("pending", pending, pending_wait),
        ):
            entry = found.get((pool, state))
            count.add_metric([pool], entry.count if entry else 0)
            oldest = entry.oldest if entry else None
            wait.add_metric([pool], max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)
    yield from (queued, queued_wait, pending, pending_wait)


def history(
    requests: Mapping[tuple[str, str, str, str], int],
    reclaimed: Mapping[tuple[str, str, str], int],
    gpu_s: Mapping[tuple[str, str], float],
) -> Iterable[Metric]:
    asked = CounterMetricFamily(
        "gpubot_requests",
        "Requests filed, by pool, team, kind (borrow, extend) and what the rules said",
        labels=["pool", "team", "kind", "outcome"],
    )
    for (pool, team, kind, outcome), count in sorted(requests.items()):
        asked.add_metric([pool, team, kind, outcome], count)
    reclaims = CounterMetricFamily(
        "gpubot_reclaims",
        "Leases reclaimed, by pool, team and reason (expired, idle, preempted, unhealthy ...)",
        labels=["pool", "team", "reason"],
    )
    for (pool, team, reason), count in sorted(reclaimed.items()):
        reclaims.add_metric([pool, team, reason], count)
    held = CounterMetricFamily(
        "gpubot_lease_gpu_seconds",
        "GPU-seconds held in leases, by pool and team (ended leases and what active ones "
        "held so far)",
        labels=["pool", "team"],
    )
    for (pool, team), seconds in sorted(gpu_s.items()):
        held.add_metric([pool, team], round(seconds, 3))
    yield from (asked, reclaims, held)


def backlog(
    owed: Mapping[str, int],
    oldest_owed: datetime | None,
    inbox_count: int,
    inbox_oldest: datetime | None,
    now: datetime,
) -> Iterable[Metric]:
    messages = GaugeMetricFamily(
        "gpubot_outbox_messages",
        "Outbox messages by state (pending and sending are the backlog; failed gave up)",
        labels=["state"],
    )
    for state in ("pending", "sending", "delivered", "dropped", "failed"):
        messages.add_metric([state], owed.get(state, 0))
    yield messages
    yield gauge(
        "gpubot_outbox_oldest_age_seconds",
        "Age of the oldest message still owed (0: none)",
        _age(oldest_owed, now),
    )
    yield gauge(
        "gpubot_inbox_pending", "Acknowledged Slack requests not carried out yet", inbox_count
    )
    yield gauge(
        "gpubot_inbox_oldest_age_seconds",
        "Age of the oldest acknowledged request not carried out yet (0: none)",
        _age(inbox_oldest, now),
    )


def _age(at: datetime | None, now: datetime) -> float:
    return 0.0 if at is None else max(0.0, (now - at).total_seconds())


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
