"""Recording what became of outbox rows sent to Slack: delivered, dropped, or failed and due
again. An outcome the database does not take is kept in memory and recorded later, never sent
again; a pass's failures are logged in one line.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from bot.slack.sending import Dropped, Outcome, Sent
from storage import outbox
from storage.db import Database, one_line
from storage.tables import OutboxRow

log = logging.getLogger(__name__)


@dataclass
class Report:
    delivered: int = 0
    failed: int = 0
    deferred: int = 0
    dropped: int = 0
    unrecorded: int = 0  # outcomes the database could not take yet (kept, recorded later)
    database_down: bool = False  # a claim failed: the rest of the pass waits for the next
    in_doubt: int = 0  # sent again after a crash with no way to know if it had landed
    errors: list[str] = field(default_factory=list)


class Recorder:
    """Writes outcomes down, keeping those the database refused until it takes them."""

    def __init__(self, max_attempts: int = outbox.MAX_ATTEMPTS) -> None:
        self.max_attempts = max_attempts
        self._kept: dict[int, Outcome] = {}  # outcomes not recorded yet
        self._lock = threading.Lock()

    def kept_ids(self) -> list[int]:
        """The rows whose outcome waits to be recorded."""
        with self._lock:
            return sorted(self._kept)

    def kept(self, row_id: int) -> Outcome | None:
        """The outcome of a row sent (or not) earlier in this process whose record is late."""
        with self._lock:
            return self._kept.get(row_id)

    def record_all(
        self,
        db: Database,
        outcomes: list[tuple[OutboxRow, Outcome]],
        report: Report,
        *,
        at: datetime,
    ) -> list[bool]:
        """Record what became of these rows, in one transaction; per row, whether it got
        through. Outcomes the database does not take are kept, to be recorded later."""
        if not outcomes:
            return []
        retries: list[datetime | None] = []
        try:
            with db.write() as session:
                for row, outcome in outcomes:
                    assert row.id is not None
                    retries.append(self._apply(session, row.id, outcome, at))
        except SQLAlchemyError as exc:
            with self._lock:
                self._kept.update((row.id, outcome) for row, outcome in outcomes if row.id)
            report.unrecorded += len(outcomes)
            log.warning(
                "%d delivery outcome(s) kept until the database takes them (%s)",
                len(outcomes),
                one_line(exc),
            )
            return [isinstance(outcome, Sent) for _, outcome in outcomes]
        with self._lock:
            for row, _ in outcomes:
                self._kept.pop(row.id or 0, None)
        return [
            self._count(row, outcome, retry, report)
            for (row, outcome), retry in zip(outcomes, retries, strict=True)
        ]

    def _apply(self, session: Any, row_id: int, outcome: Outcome, at: datetime) -> datetime | None:
        if isinstance(outcome, Sent):
            outbox.delivered(
                session, row_id, at=at, channel=outcome.channel, ts=outcome.ts, note=outcome.note
            )
            return None
        if isinstance(outcome, Dropped):
            outbox.dropped(session, row_id, at=at, why=outcome.why)
            return None
        return outbox.failed(
            session,
            row_id,
            at=at,
            error=outcome.error,
            retry_after=outcome.retry_after,
            max_attempts=self.max_attempts,
            in_doubt=outcome.in_doubt,
        )

    def _count(
        self, row: OutboxRow, outcome: Outcome, retry: datetime | None, report: Report
    ) -> bool:
        if isinstance(outcome, Sent):
            report.delivered += 1
            return True
        if isinstance(outcome, Dropped):
            report.dropped += 1
            return True
        report.failed += 1
        report.errors.append(f"{row.kind} {row.subject}: {outcome.error}")
        if retry is None:
            log.error(
                "outbox row %s (%s to %s) given up after %d attempts: %s",
                row.id,
                row.kind,
                row.recipient,
                self.max_attempts,
                outcome.error,
            )
        else:
            log.debug(
                "delivery of %s %s failed (%s); retrying at %s",
                row.kind,
                row.subject,
                outcome.error,
                retry.isoformat(),
            )
        return False


def summarise(report: Report) -> None:
    """One line for the deliveries that failed in a pass (each waits its backoff), not one each:
    an outage would otherwise write a line per owed message per try."""
    if report.failed:
        tried = report.delivered + report.failed
        log.warning(
            "%d of %d deliveries failed, each retried with backoff (first: %s)",
            report.failed,
            tried,
            report.errors[0] if report.errors else "?",
        )
