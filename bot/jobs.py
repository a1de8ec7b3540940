"""The periodic jobs, on APScheduler 3: explicit ids, coalesced, one instance each.

All durable state is in the database, so a restart rebuilds the jobs from code and the next run
picks up where things stood. Tests call the job functions directly instead of starting this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

log = logging.getLogger(__name__)

INBOX = "inbox"
OUTBOX = "outbox"
OUTCOMES = "outcomes"  # delivery outcomes the database did not take at once (every replica)
POLL = "poll"
SWEEP = "sweep"
RETENTION = "retention"
ROLLUP = "rollup"


class Jobs:
    """Owns the scheduler; `kick(job)` runs a job now instead of at its next tick."""

    def __init__(self) -> None:
        self.scheduler = BackgroundScheduler(
            timezone=UTC,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60},
        )

    def every(self, job_id: str, interval: timedelta, func: Callable[[], Any]) -> None:
        self.scheduler.add_job(
            _logged(job_id, func),
            "interval",
            seconds=interval.total_seconds(),
            id=job_id,
            name=job_id,
            replace_existing=True,
            next_run_time=datetime.now(UTC),
        )

    def kick(self, job_id: str) -> None:
        """Run soon rather than at the next interval (e.g. a decision owes a message)."""
        if self.scheduler.running and self.scheduler.get_job(job_id) is not None:
            self.scheduler.modify_job(job_id, next_run_time=datetime.now(UTC))

    def start(self) -> None:
        self.scheduler.start()

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)


def _logged(job_id: str, func: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            func()
        except Exception:
            # A failing pass must not kill the job: the next tick tries again.
            log.exception("job %s failed; it runs again at its next tick", job_id)

    return run
