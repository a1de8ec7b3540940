"""/metrics: Prometheus figures computed from the database at scrape time (so every replica,
and a restarted one, tells the same), and the decision and sweep duration histograms this
process observes.

Labels name pools, teams, nodes, states, reasons and outcomes, never a person: a user id in a
label would put who borrowed what into every dashboard and keep it in Prometheus for good.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from rules.policy import Policy
from storage import metrics as figures
from storage.db import Database, one_line

log = logging.getLogger(__name__)

#: How old a request's filing or a lease's end must be before the history counters take it
#: in for good (no transaction stays open this long, nor a replica's clock lags this far).
SETTLE = timedelta(minutes=5)

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
    """The registry's figures in the text exposition format (CONTENT_TYPE).

    A family of many plain samples (a telemetry age per node: 12,500 of them at 100,000 GPUs)
    is written here, the same bytes prometheus_client writes at a fraction of its cost; the
    others are written by prometheus_client."""
    out = []
    for metric in registry.collect():
        quick = None
        if metric.type in ("gauge", "counter") and len(metric.samples) > _MANY:
            quick = _plain_family(metric)
        out.append(quick if quick is not None else generate_latest(_Only(metric)))
    return b"".join(out)


_MANY = 200  # samples from which a family takes the quick way


class _Only:
    """One collected family, as a collector prometheus_client can write."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


def _plain_family(metric: Metric) -> bytes | None:
    """A gauge or counter family of plain samples, as generate_latest writes it (None: it has
    more than plain samples)."""
    name = metric.name + ("_total" if metric.type == "counter" else "")
    if any(s.name != name or s.timestamp is not None or s.exemplar for s in metric.samples):
        return None
    help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {help_text}\n# TYPE {name} {metric.type}\n"]
    for sample in metric.samples:
        labels = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(sample.labels.items()))
        line = f"{name}{{{labels}}}" if labels else name
        value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]  # unannotated there
        lines.append(f"{line} {value}\n")
    return "".join(lines).encode()


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


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
        self,
        services: Scraped,
        health: Callable[[], Mapping[str, Any]] | None = None,
        *,
        settle: timedelta = SETTLE,
    ) -> None:
        self.services = services
        self.health = health
        self.history = History(settle)
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
            figures.one_snapshot(session)
            fleet = figures.fleet(session, now)
            active = figures.active_leases(session, now)
            waits = figures.waiting(session)
            requests, reclaimed, gpu_s = self.history.read(session, now, active)
            owed = figures.outbox_states(session)
            oldest_owed = figures.oldest_owed(session)
            inbox_count, inbox_oldest = figures.inbox_backlog(session)
            slack_paused_at = figures.paused_since(session)
            chain_ok = figures.audit_chain_ok(session)
        yield from _fleet(policy, fleet)
        yield from _quotas(policy, active.held)
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


class History:
    """The counters over the whole history (requests by outcome, reclaims, GPU-seconds): a
    base of totals up to a time, moved on at each scrape, plus what came after it.

    A filed request and an ended lease never change, so the totals up to a time stay true once
    `settle` has passed (a transaction writes its times before it commits, so a row dated just
    before now can still be in flight). The first scrape starts from the checkpoint the leader
    stores (`store_checkpoint`) and adds only what came after it; with no checkpoint yet it
    counts the whole history once. Each later scrape reads only the rows of the last minutes."""

    def __init__(self, settle: timedelta = SETTLE) -> None:
        self.settle = settle
        self.lock = threading.Lock()  # two scrapes at once must not move the base twice
        self.base: figures.Totals | None = None
        # The GPU-seconds last emitted: an active lease counts up to this scrape's clock and an
        # ended one up to its end, so a lease ending (committed late, or by a replica whose
        # clock runs behind) could lower the sum; a counter must never go down.
        self.gpu_s_shown: dict[tuple[str, str], float] = {}

    def read(
        self, session: Session, now: datetime, active: figures.Active
    ) -> tuple[
        dict[tuple[str, str, str, str], int],
        dict[tuple[str, str, str], int],
        dict[tuple[str, str], float],
    ]:
        """(requests by pool, team, kind and outcome; reclaims by pool, team and reason;
        GPU-seconds by pool and team) as the database holds them now."""
        with self.lock:
            if self.base is None:
                self.base = figures.checkpoint(session) or figures.Totals()
            self.base = moved_on(session, self.base, now - self.settle)
            total = self.base.plus(figures.totals_between(session, self.base.upto, None))
            gpu_s = dict(total.gpu_s)
            _add(gpu_s, active.gpu_s)
            for key, shown in self.gpu_s_shown.items():
                gpu_s[key] = max(gpu_s.get(key, 0.0), shown)
            self.gpu_s_shown = dict(gpu_s)
        return total.requests, total.reclaims, gpu_s


def moved_on(session: Session, base: figures.Totals, until: datetime) -> figures.Totals:
    """`base` taken on to `until` (never back: a clock stepping back leaves it where it is)."""
    if base.upto is not None and until <= base.upto:
        return base
    return base.plus(figures.totals_between(session, base.upto, until))


def store_checkpoint(db: Database, now: datetime, settle: timedelta = SETTLE) -> bool:
    """The leader's periodic job: take the stored checkpoint on to `now - settle`, so that a
    replica's first scrape adds minutes of rows to it, not the whole history. Whether it was
    written (not when another writer got as far first)."""
    with db.write() as session:
        base = figures.checkpoint(session) or figures.Totals()
        moved = moved_on(session, base, now - settle)
        return moved is not base and figures.store_checkpoint(session, moved, now)


def _add(into: dict[Any, Any], more: Mapping[Any, Any]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value


def _fleet(policy: Policy, fleet: figures.Fleet) -> Iterable[Metric]:
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
    for (pool, state), count in sorted(fleet.states.items()):
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
    for node in fleet.nodes:
        key = (node.pool, node.reporting)
        by_state[key] = by_state.get(key, 0) + 1
        if node.telemetry_age_s is not None:
            # Milliseconds: the database's arithmetic on times leaves microsecond dust.
            age.add_metric([node.name, node.pool], max(0.0, round(node.telemetry_age_s, 3)))
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
