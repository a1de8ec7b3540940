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

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import InfoMetricFamily
from prometheus_client.metrics_core import Metric
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from bot import metrics_families as families
from bot.metrics_families import gauge
from bot.metrics_text import CONTENT_TYPE, scrape
from rules.policy import Policy
from storage import metrics as figures
from storage import metrics_history as past
from storage.db import Database, one_line

__all__ = [
    "CONTENT_TYPE",
    "DECISION_SECONDS",
    "SETTLE",
    "SWEEP_SECONDS",
    "DatabaseCollector",
    "History",
    "Scraped",
    "allowed",
    "build_registry",
    "scrape",
    "store_checkpoint",
]

log = logging.getLogger(__name__)

#: How old a request's filing or a lease's end must be before the history counters take it
#: in for good (no transaction stays open this long, nor a replica's clock lags this far).
SETTLE = timedelta(minutes=5)

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
            yield gauge("gpubot_healthy", "1 when /healthz says ok, else 0", float(self._ok()))
        try:
            found = list(self._from_database(policy, services.now()))
        except SQLAlchemyError as exc:
            if not self._failing:
                log.warning("metrics: the database cannot be read (%s)", one_line(exc))
            self._failing = True
            yield gauge("gpubot_database_up", "1 when the database answered this scrape", 0.0)
            return
        if self._failing:
            log.info("metrics: the database answers again")
        self._failing = False
        yield gauge("gpubot_database_up", "1 when the database answered this scrape", 1.0)
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
        yield from families.fleet(policy, fleet)
        yield from families.quotas(policy, active.held)
        yield from families.waiting(policy, waits, now)
        yield from families.history(requests, reclaimed, gpu_s)
        yield from families.backlog(owed, oldest_owed, inbox_count, inbox_oldest, now)
        paused = policy.automation_paused or slack_paused_at is not None
        yield gauge("gpubot_automation_paused", "1 while automation is paused", float(paused))
        if slack_paused_at is not None:
            yield gauge(
                "gpubot_automation_paused_since_timestamp_seconds",
                "When an admin paused automation from Slack (Unix time)",
                slack_paused_at.timestamp(),
            )
        yield gauge(
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
    counts the whole history once. Each later scrape reads only the rows of the last minutes,
    and the rows written since the last scrape with earlier times (history backfilled in
    bulk), found by their ids (storage.metrics_history.moved_on). What stays out of reach: a
    lease granted before the base and ended later with an `ended_at` already older than the
    base, which takes a clock more than `settle` behind; and, on PostgreSQL, rows backfilled
    with earlier times by a transaction still open while newer rows commit (ids are handed out
    at insert, not at commit): only the demo's seeding backfills, on SQLite, before serving."""

    def __init__(self, settle: timedelta = SETTLE) -> None:
        self.settle = settle
        self.lock = threading.Lock()  # two scrapes at once must not move the base twice
        self.base: past.Totals | None = None
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
                self.base = past.checkpoint(session) or past.Totals()
            self.base = past.moved_on(session, self.base, now - self.settle)
            total = self.base.plus(past.totals_between(session, self.base.upto, None))
            gpu_s = dict(total.gpu_s)
            _add(gpu_s, active.gpu_s)
            for key, shown in self.gpu_s_shown.items():
                gpu_s[key] = max(gpu_s.get(key, 0.0), shown)
            self.gpu_s_shown = dict(gpu_s)
        return total.requests, total.reclaims, gpu_s


def store_checkpoint(db: Database, now: datetime, settle: timedelta = SETTLE) -> bool:
    """The leader's periodic job: take the stored checkpoint on to `now - settle`, so that a
    replica's first scrape adds minutes of rows to it, not the whole history. Whether it was
    written (not when another writer got as far first)."""
    # Read in one snapshot (PostgreSQL): the newest ids and the rows counted must agree, or a
    # row committed between the two reads would be counted now and again as written late.
    with db.read() as session:
        figures.one_snapshot(session)
        base = past.checkpoint(session) or past.Totals()
        moved = past.moved_on(session, base, now - settle)
    with db.write() as session:
        return past.store_checkpoint(session, moved, now)


def _add(into: dict[Any, Any], more: Mapping[Any, Any]) -> None:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value
