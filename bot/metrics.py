"""/metrics: Prometheus figures computed from the database at scrape time (so every replica,
and a restarted one, tells the same), and the decision and sweep duration histograms this
process observes.

Labels name pools, teams, nodes, states, reasons and outcomes, never a person: a user id in a
label would put who borrowed what into every dashboard and keep it in Prometheus for good.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from sqlalchemy.exc import SQLAlchemyError

from rules.policy import Policy
from storage import metrics as figures
from storage.db import Database, one_line

log = logging.getLogger(__name__)

#: The text exposition format every Prometheus server reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Process-local, registered in no global registry: `build_registry` adds them to its own.
# A request decision takes tens of microseconds; a sweep of a large fleet, seconds.
DECISION_SECONDS = Histogram(
    "gpubot_decision_seconds",
    "Time the rules took to decide one request (borrow, extend, queue), in this process",
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0),
    registry=None,
)
SWEEP_SECONDS = Histogram(
    "gpubot_sweep_seconds",
    "Time one sweep (the periodic reconcile pass) took, in this process",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0),
    registry=None,
)


class Scraped(Protocol):
    """What the collector reads (bot.services.Services gives all of it)."""

    @property
    def db(self) -> Database: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def engine_name(self) -> str: ...
    def now(self) -> datetime: ...


def build_registry(
    services: Scraped, *, health: Callable[[], Mapping[str, Any]] | None = None
) -> CollectorRegistry:
    """A registry holding the database figures, the two histograms and, with `health`, the
    health check's verdict (`gpubot_healthy`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(services, health))
    registry.register(DECISION_SECONDS)
    registry.register(SWEEP_SECONDS)
    return registry


def scrape(registry: CollectorRegistry) -> bytes:
    """The registry's figures in the text exposition format (CONTENT_TYPE)."""
    return generate_latest(registry)


def allowed(authorization: str | None, token: str | None) -> bool:
    """Whether a request may read /metrics: always without a token, else only with
    `Authorization: Bearer <token>` (compared in constant time)."""
    if not token:
        return True
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


class DatabaseCollector:
    """Every scrape reads the database afresh, in a handful of grouped queries."""

    def __init__(
        self, services: Scraped, health: Callable[[], Mapping[str, Any]] | None = None
    ) -> None:
        self.services = services
        self.health = health
        self._failing = False  # the database failed the last scrape: said once, not each time

    def describe(self) -> Iterable[Metric]:
        # Nothing to check names against at registration, and no database read there.
        return []

    def collect(self) -> Iterable[Metric]:
        services = self.services
        policy = services.policy
        info = InfoMetricFamily(
            "gpubot_rules", "The rules in force in this process", labels=["revision", "engine"]
        )
        info.add_metric([policy.revision, services.engine_name], {})
        yield info
        if self.health is not None:
            yield _gauge("gpubot_healthy", "1 when /healthz says ok, else 0", float(self._ok()))
        try:
            found = list(self._from_database(policy, services.now()))
        except SQLAlchemyError as exc:
            if not self._failing:
                log.warning("metrics: the database cannot be read (%s)", one_line(exc))
            self._failing = True
            yield _gauge("gpubot_database_up", "1 when the database answered this scrape", 0.0)
            return
        if self._failing:
            log.info("metrics: the database answers again")
        self._failing = False
        yield _gauge("gpubot_database_up", "1 when the database answered this scrape", 1.0)
        yield from found

    def _ok(self) -> bool:
        assert self.health is not None
        try:
            return bool(self.health().get("ok"))
        except Exception:  # a failing check is an unhealthy process, not a failed scrape
            log.exception("metrics: the health check failed")
            return False

    def _from_database(self, policy: Policy, now: datetime) -> Iterable[Metric]:
        with self.services.db.read() as session:
            states = figures.gpu_states(session)
            node_rows = figures.node_figures(session)
            held = figures.held_gpus(session)
            waits = figures.waiting(session)
            requests = figures.requests_by_outcome(session)
            reclaimed = figures.reclaims(session)
            gpu_s = figures.gpu_seconds(session, now)
            owed = figures.outbox_states(session)
            oldest_owed = figures.oldest_owed(session)
            inbox_count, inbox_oldest = figures.inbox_backlog(session)
            slack_paused_at = figures.paused_since(session)
            chain_ok = figures.audit_chain_ok(session)
        yield from _fleet(policy, states, node_rows, now)
        yield from _quotas(policy, held)
        yield from _waiting(policy, waits, now)
        yield from _history(requests, reclaimed, gpu_s)
        yield from _backlog(owed, oldest_owed, inbox_count, inbox_oldest, now)
        paused = policy.automation_paused or slack_paused_at is not None
        yield _gauge("gpubot_automation_paused", "1 while automation is paused", float(paused))
        if slack_paused_at is not None:
            yield _gauge(
                "gpubot_automation_paused_since_timestamp_seconds",
                "When an admin paused automation from Slack (Unix time)",
                slack_paused_at.timestamp(),
            )
        yield _gauge(
            "gpubot_audit_chain_ok",
            "1 when the audit chain's head and last row agree and hash right, else 0",
            float(chain_ok),
        )


def _fleet(
    policy: Policy,
    states: list[tuple[str, str, int]],
    node_rows: list[figures.NodeFigure],
    now: datetime,
) -> Iterable[Metric]:
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
    for pool, state, count in sorted(states):
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
    age = GaugeMetricFamily(
        "gpubot_node_telemetry_age_seconds",
        "Seconds since telemetry last profiled a GPU of the node (written at least every 5 "
        "minutes while samples arrive); nodes never heard from have no series",
        labels=["node", "pool"],
    )
    for node in sorted(node_rows, key=lambda n: n.name):
        key = (node.pool, node.reporting)
        by_state[key] = by_state.get(key, 0) + 1
        if node.profiled_at is not None:
            age.add_metric(
                [node.name, node.pool], max(0.0, (now - node.profiled_at).total_seconds())
            )
    for (pool, reporting), count in sorted(by_state.items()):
        nodes.add_metric([pool, reporting], count)
    yield from (gpus, unreserved, nodes, age)


def _quotas(policy: Policy, held: Mapping[tuple[str, str], int]) -> Iterable[Metric]:
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


def _waiting(policy: Policy, waits: list[figures.Waiting], now: datetime) -> Iterable[Metric]:
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


def _history(
    requests: list[tuple[str, str, str, str, int]],
    reclaimed: list[tuple[str, str, str, int]],
    gpu_s: Mapping[tuple[str, str], float],
) -> Iterable[Metric]:
    asked = CounterMetricFamily(
        "gpubot_requests",
        "Requests filed, by pool, team, kind (borrow, extend) and what the rules said",
        labels=["pool", "team", "kind", "outcome"],
    )
    for pool, team, kind, outcome, count in sorted(requests):
        asked.add_metric([pool, team, kind, outcome], count)
    reclaims = CounterMetricFamily(
        "gpubot_reclaims",
        "Leases reclaimed, by pool, team and reason (expired, idle, preempted, unhealthy ...)",
        labels=["pool", "team", "reason"],
    )
    for pool, team, reason, count in sorted(reclaimed):
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


def _backlog(
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
    yield _gauge(
        "gpubot_outbox_oldest_age_seconds",
        "Age of the oldest message still owed (0: none)",
        _age(oldest_owed, now),
    )
    yield _gauge(
        "gpubot_inbox_pending", "Acknowledged Slack requests not carried out yet", inbox_count
    )
    yield _gauge(
        "gpubot_inbox_oldest_age_seconds",
        "Age of the oldest acknowledged request not carried out yet (0: none)",
        _age(inbox_oldest, now),
    )


def _age(at: datetime | None, now: datetime) -> float:
    return 0.0 if at is None else max(0.0, (now - at).total_seconds())


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
