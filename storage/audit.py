"""The audit log: append-only, hash-chained rows proving every decision and state change.

Each row's hash covers the previous row's hash and all of its own columns, so an edited,
deleted or inserted row breaks the chain that `verify` walks (invariant 6). The JSON columns are
stored as the canonical JSON the hash covers. This module writes the chain and answers small
reads; `verify` and `export`, which read it all back, live in storage/audit_verify.py and are
imported from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator
from sqlmodel import Session, col, select

from storage import audit_text
from storage.audit_text import GENESIS_HASH, digest, plain
from storage.audit_text import HEAD_ID as _HEAD_ID
from storage.audit_verify import (
    CHUNK_ROWS,
    EXPORT_CHUNK_ROWS,
    MAX_WORKERS,
    ExportFormat,
    VerifyReport,
    export,
    export_blocks,
    verify,
)
from storage.db import lock_for_update
from storage.tables import AuditHeadRow, AuditRow

canonical_json = audit_text.canonical_json  # the serialisation hashes are computed over

# Reading the chain back lives in storage.audit_verify; callers find it here.
__all__ = [
    "CHUNK_ROWS",
    "EXPORT_CHUNK_ROWS",
    "EXPORT_COLUMNS",
    "GENESIS_HASH",
    "HASHED_COLUMNS",
    "MAX_WORKERS",
    "AuditChainError",
    "AuditEntry",
    "AuditTag",
    "ExportFormat",
    "VerifyReport",
    "append",
    "append_all",
    "canonical_json",
    "chain_hash",
    "details_since",
    "export",
    "export_blocks",
    "get",
    "history",
    "hold_head",
    "recorded_since",
    "verify",
]

#: The columns a row's hash covers, in no particular order (the JSON keys are sorted): every
#: exported column but the row's own hash (storage.audit_text.HEADER lists them).
#: A new audit column must be added there deliberately: it changes what old rows hash to.
HASHED_COLUMNS = audit_text.HEADER[:-1]
EXPORT_COLUMNS = audit_text.HEADER
_JSON_COLUMNS = frozenset(audit_text.JSON_COLUMNS)

_audit = AuditRow.__table__  # type: ignore[attr-defined]  # SQLModel sets it at class creation
_head = AuditHeadRow.__table__  # type: ignore[attr-defined]


class AuditTag(StrEnum):
    """Every tag an audit row carries, `subject:action`: what it is about, and what happened."""

    AGENT_REFUSED = "agent:refused"
    APPROVAL_REFUSED = "approval:refused"
    AUTOMATION_PAUSED = "automation:paused"
    AUTOMATION_RESUMED = "automation:resumed"
    BORROW_APPROVED = "borrow:approved"
    BORROW_ASKED = "borrow:asked"
    BORROW_QUEUED = "borrow:queued"
    BORROW_DENIED = "borrow:denied"
    ENFORCE_ORDERED = "enforce:ordered"
    ENFORCE_DONE = "enforce:done"
    EXTEND_APPROVED = "extend:approved"
    EXTEND_ASKED = "extend:asked"
    EXTEND_DENIED = "extend:denied"
    EXTEND_WITHDRAWN = "extend:withdrawn"
    GPU_SWAPPED = "gpu:swapped"
    GPU_UNHEALTHY = "gpu:unhealthy"
    GPU_UNRESERVED = "gpu:unreserved"
    INVENTORY_SYNCED = "inventory:synced"
    LEASE_GRANTED = "lease:granted"
    LEASE_EXTENDED = "lease:extended"
    LEASE_SNOOZED = "lease:snoozed"
    LEASE_WARNED = "lease:warned"
    LEASE_INTRUDED = "lease:intruded"
    LEASE_RECALLED = "lease:recalled"
    LEASE_RECALL_REASSIGNED = "lease:recall-reassigned"
    LEASE_RECALL_WITHDRAWN = "lease:recall-withdrawn"
    LEASE_RELEASED = "lease:released"
    LEASE_RECLAIMED = "lease:reclaimed"
    LEASE_SHRUNK = "lease:shrunk"  # some GPUs given back, the lease runs on with the rest
    LEASE_KEPT = "lease:kept"  # the holder keeps every GPU: no more partly-idle warnings
    NODE_UNKNOWN = "node:unknown"
    NODE_NOT_REPORTING = "node:not-reporting"
    NODE_BACK = "node:back"
    NODE_DRAINED = "node:drained"
    NODE_UNDRAINED = "node:undrained"
    QUEUE_GRANTED = "queue:granted"
    QUEUE_TIMED_OUT = "queue:timed-out"
    QUEUE_WOULD_HAVE = "queue:would-have"
    QUOTA_REFUSED = "quota:refused"
    RECALL_WOULD_HAVE = "recall:would-have"
    REQUEST_ASKED_AGAIN = "request:asked-again"
    REQUEST_CANCELLED = "request:cancelled"
    REQUEST_ESCALATED = "request:escalated"
    REQUEST_EXPIRED = "request:expired"
    REQUEST_NUDGED = "request:nudged"
    REQUEST_REMINDED = "request:reminded"
    REQUEST_STILL_PENDING = "request:still-pending"
    REQUEST_WOULD_HAVE = "request:would-have"
    RULES_RELOADED = "rules:reloaded"
    RULES_REJECTED = "rules:rejected"
    SWEEP_RECLAIM = "sweep:reclaim"
    SWEEP_WOULD_HAVE = "sweep:would-have"
    SWEEP_NOTIFIED = "sweep:notified"


class _JsonText(TypeDecorator[str]):
    """A JSON column given its canonical text, stored as it is: what `verify` hashes again."""

    impl = sa.JSON
    cache_ok = True

    def bind_processor(self, dialect: sa.Dialect) -> None:
        return None  # already JSON: encoding it again would store a JSON string


# Built once: compiled once per dialect and reused, with only parameters changing per append.
_HEAD_QUERY = sa.select(_head.c.last_id, _head.c.last_hash).where(_head.c.id == _HEAD_ID)
_INSERT_ROW = sa.insert(_audit).values(
    {name: sa.bindparam(name, type_=_JsonText()) for name in sorted(_JSON_COLUMNS)}
)
_ADVANCE_HEAD = (
    sa.update(_head)
    .where(_head.c.id == _HEAD_ID)
    .values(last_id=sa.bindparam("new_id"), last_hash=sa.bindparam("new_hash"))
)


class AuditChainError(RuntimeError):
    """The chain cannot be extended safely (its head is gone while rows remain)."""


@dataclass(frozen=True)
class AuditEntry:
    """What a caller wants recorded; `append` adds the id, time and chain hashes."""

    actor: str
    tag: AuditTag | str  # subject:action, e.g. lease:granted (tests use their own)
    subject: str  # e.g. lease:12, request:7, rules
    outcome: str = ""
    deciding_rule: str = ""
    matching_rules: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    detail: Mapping[str, Any] = field(default_factory=dict)
    revision: str = ""
    engine: str = ""


def chain_hash(prev_hash: str, content: Mapping[Any, Any]) -> str:
    """sha256 over the previous hash and the canonical JSON of a row's hashed columns."""
    body = {name: content[name] for name in HASHED_COLUMNS}
    body["at"] = body["at"].astimezone(UTC).isoformat()
    return digest(prev_hash, canonical_json(body))


def hold_head(session: Session) -> None:
    """Lock the chain's head now (PostgreSQL), as a transaction that will append would anyway,
    for a caller that must lock it before its own rows to keep one lock order (storage.pools)."""
    if session.get_bind().dialect.name == "postgresql":
        _locked_head(session)


def _locked_head(session: Session) -> tuple[int, str]:
    query = lock_for_update(session, _HEAD_QUERY)
    head = session.execute(query).first()
    if head is not None:
        return head.last_id, head.last_hash
    # Two first appenders may race here: the loser's insert waits for the winner's commit and
    # then does nothing, and the loser goes on to extend the winner's chain.
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    # RETURNING says whether this insert made the row (psycopg reports rowcount -1 here).
    created = session.execute(
        insert(_head)
        .values(id=_HEAD_ID, last_id=0, last_hash=GENESIS_HASH)
        .on_conflict_do_nothing(index_elements=["id"])
        .returning(_head.c.id)
    ).first()
    # Only the creator checks for orphaned rows: it holds the new head, so no append can be
    # in flight, and rows without a head mean the head was deleted, not that it is new.
    if created is not None and session.execute(sa.select(_audit.c.id).limit(1)).first():
        raise AuditChainError("the audit head row is missing while audit rows exist")
    head = session.execute(query).one()
    return head.last_id, head.last_hash


def append(session: Session, entry: AuditEntry, *, at: datetime) -> AuditRow:
    """Append `entry` inside the caller's transaction, which commits it with its state change.

    Returns a detached copy of the new row.
    """
    if at.tzinfo is None:
        raise ValueError("audit times must be aware UTC datetimes")
    last_id, last_hash = _locked_head(session)
    values = _values(entry, at, last_id + 1, last_hash)
    # Core statements: the ORM unit of work costs more than the hashing does.
    session.execute(_INSERT_ROW, _stored(values))
    session.execute(_ADVANCE_HEAD, {"new_id": values["id"], "new_hash": values["hash"]})
    # Trusted values just written: skip the model's constructor (about 50 µs an append).
    return AuditRow.model_construct(**values)


def append_all(session: Session, entries: Sequence[tuple[AuditEntry, datetime]]) -> list[int]:
    """Append `(entry, at)` pairs in their order under one lock of the head, in one insert:
    an import of many rows at once (the demo's seeded history). Returns their ids."""
    if any(at.tzinfo is None for _, at in entries):
        raise ValueError("audit times must be aware UTC datetimes")
    if not entries:
        return []
    last_id, last_hash = _locked_head(session)
    rows = []
    for entry, at in entries:
        values = _values(entry, at, last_id + 1, last_hash)
        rows.append(values)
        last_id, last_hash = values["id"], values["hash"]
    session.execute(_INSERT_ROW, [_stored(row) for row in rows])
    session.execute(_ADVANCE_HEAD, {"new_id": last_id, "new_hash": last_hash})
    return [row["id"] for row in rows]


def _values(entry: AuditEntry, at: datetime, row_id: int, prev_hash: str) -> dict[str, Any]:
    """The row `entry` makes at `row_id` after `prev_hash`, its own hash included."""
    values: dict[str, Any] = {
        "id": row_id,
        "at": at.astimezone(UTC),
        "actor": entry.actor,
        "tag": str(entry.tag),
        "subject": entry.subject,
        "outcome": entry.outcome,
        "deciding_rule": entry.deciding_rule,
        "matching_rules": plain(list(entry.matching_rules)),
        "facts": plain(entry.facts),
        "detail": plain(entry.detail),
        "revision": entry.revision,
        "engine": entry.engine,
        "prev_hash": prev_hash,
    }
    values["hash"] = chain_hash(prev_hash, values)
    return values


def _stored(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` as they are inserted: the JSON columns as the canonical text that was hashed."""
    return {
        name: canonical_json(value) if name in _JSON_COLUMNS else value
        for name, value in values.items()
    }


def history(session: Session, subject: str) -> list[AuditRow]:
    """Every row about `subject` (e.g. `lease:12`), oldest first."""
    query = select(AuditRow).where(AuditRow.subject == subject).order_by(col(AuditRow.id))
    return list(session.exec(query))


def details_since(session: Session, tag: str, since: datetime) -> list[Mapping[Any, Any]]:
    """The details of the rows tagged `tag` written at `since` or later."""
    stmt = select(AuditRow.detail).where(AuditRow.tag == tag, col(AuditRow.at) >= since)
    return list(session.exec(stmt).all())


def recorded_since(
    session: Session, tag: str, subject: str, outcome: str, since: datetime | None
) -> bool:
    """Whether a row tagged `tag` about `subject` with `outcome` was written at `since` or
    later (ever, when `since` is None)."""
    stmt = select(AuditRow.id).where(
        AuditRow.tag == tag, AuditRow.subject == subject, AuditRow.outcome == outcome
    )
    if since is not None:
        stmt = stmt.where(col(AuditRow.at) >= since)
    return session.exec(stmt.limit(1)).first() is not None


def get(session: Session, audit_id: int) -> AuditRow | None:
    return session.get(AuditRow, audit_id)
