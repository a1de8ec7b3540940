"""What every use case works with: the database, the live policy and the clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlmodel import Session

from rules.decision import Decision
from rules.engine.live import LivePolicy
from rules.policy import Policy
from storage import audit, homes
from storage.audit import AuditEntry, AuditTag
from storage.db import Database
from storage.tables import AuditRow

Enforcer = Literal["notify", "signal", "signal-dry-run", "slurm", "kubernetes"]
SYSTEM = "gpubot"  # the actor of what the bot does on its own


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Context:
    db: Database
    live: LivePolicy
    clock: Callable[[], datetime] = utcnow
    enforcer: Enforcer = "notify"  # what a reclaim does to the holder's running processes

    @property
    def policy(self) -> Policy:
        return self.live.policy

    def now(self) -> datetime:
        now = self.clock()
        if now.tzinfo is None:  # freezegun hands out naive datetimes: they are UTC
            now = now.replace(tzinfo=UTC)
        return now


def record(
    session: Session,
    *,
    at: datetime,
    actor: str,
    tag: AuditTag,
    subject: str,
    decision: Decision | None = None,
    outcome: str = "",
    detail: Mapping[str, object] | None = None,
) -> AuditRow:
    """Append one audit row in the caller's transaction; a decision brings its explanation.
    The subject is noted, so the Home tabs that show it are drawn again (bot.services.homes)."""
    homes.touch(session, subject)
    info: dict[str, object] = dict(detail or {})
    if decision is None:
        return audit.append(
            session,
            AuditEntry(actor=actor, tag=tag, subject=subject, outcome=outcome, detail=info),
            at=at,
        )
    info["because"] = decision.because
    if decision.would_have:
        info["would_have"] = [
            {"rule": m.rule, "then": str(m.verdict), "because": m.because}
            for m in decision.would_have
        ]
    if decision.actions:
        info["actions"] = [str(m.verdict) for m in decision.actions]
    return audit.append(
        session,
        AuditEntry(
            actor=actor,
            tag=tag,
            subject=subject,
            outcome=outcome or (str(decision.verdict) if decision.verdict else ""),
            deciding_rule=decision.deciding,
            matching_rules=tuple(decision.matching),
            facts=decision.facts,
            detail=info,
            revision=decision.revision,
            engine=decision.engine,
        ),
        at=at,
    )
