"""The audit log: append-only, hash-chained rows proving every decision and state change.

Each row's hash covers the previous row's hash and all of its own columns, so an edited,
deleted or inserted row breaks the chain that `verify` walks (invariant 6). The JSON columns are
stored as the canonical JSON the hash covers, so `verify` and `export` read rows as stored
(storage/audit_text.py), a big log range by range in worker processes (storage/audit_workers.py).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator
from sqlmodel import Session, col, select

from storage import audit_text, audit_workers
from storage.audit_text import Span, digest, plain
from storage.db import lock_for_update
from storage.tables import AuditHeadRow, AuditRow

ExportFormat = Literal["csv", "jsonl"]
canonical_json = audit_text.canonical_json  # the serialisation hashes are computed over

GENESIS_HASH = "0" * 64
_HEAD_ID = 1

#: The columns a row's hash covers, in no particular order (the JSON keys are sorted): every
#: exported column but the row's own hash (storage.audit_text.HEADER lists them).
#: A new audit column must be added there deliberately: it changes what old rows hash to.
HASHED_COLUMNS = audit_text.HEADER[:-1]
EXPORT_COLUMNS = audit_text.HEADER
_JSON_COLUMNS = frozenset(audit_text.JSON_COLUMNS)
#: Rows per range of ids: the unit a worker process checks, its fetches streamed in batches.
CHUNK_ROWS = 50_000
#: The most worker processes a verify or export starts unless told (`workers=`).
MAX_WORKERS = 8
#: Rows per range an export worker writes: it holds the range's lines until they are read.
EXPORT_CHUNK_ROWS = 10_000

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


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    checked: int
    first_bad_id: int | None = None
    problem: str = ""


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


@dataclass(frozen=True)
class _Bounds:
    """What one snapshot holds: every row's id is in `low < id <= high`; the head, if any; and
    (PostgreSQL, for worker processes) the snapshot's exported id."""

    low: int
    high: int
    head: tuple[int, str] | None
    snapshot: str = ""


def _bounds(session: Session, *, export_snapshot: bool) -> _Bounds:
    # One statement: the ids and the head come from one snapshot even outside REPEATABLE READ.
    ids = sa.select(sa.func.min(_audit.c.id), sa.func.max(_audit.c.id)).subquery()
    head = sa.select(_head.c.last_id, _head.c.last_hash).where(_head.c.id == _HEAD_ID).subquery()
    columns: list[Any] = [ids.c[0], ids.c[1], head.c.last_id, head.c.last_hash]
    if export_snapshot:
        columns.append(sa.func.pg_export_snapshot())
    found = session.execute(sa.select(*columns).select_from(ids.outerjoin(head, sa.true()))).one()
    first, last = found[0], found[1]
    return _Bounds(
        low=min(first, 1) - 1 if first is not None else 0,
        high=last if last is not None else 0,
        head=(found[2], found[3]) if found[2] is not None else None,
        snapshot=found[4] if export_snapshot else "",
    )


def _ranges(bounds: _Bounds, chunk_rows: int) -> list[tuple[int, int]]:
    starts = range(bounds.low, bounds.high, chunk_rows)
    return [(start, min(start + chunk_rows, bounds.high)) for start in starts]


def _workers(session: Session, wanted: int | None, ranges: int) -> int:
    """How many worker processes check the ranges: none (this process does) for a log of one
    range or an in-memory database, which no other process can open."""
    url = session.get_bind().engine.url
    if ranges < 2 or (url.get_backend_name() == "sqlite" and _is_memory(url)):
        return 0
    if wanted is None:
        # One per CPU, up to a few: each holds a database connection of its own.
        wanted = min(os.cpu_count() or 1, MAX_WORKERS)
    return min(wanted, ranges) if wanted > 1 else 0


def _is_memory(url: sa.URL) -> bool:
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def _source(session: Session, snapshot: str) -> audit_text.Source:
    url = session.get_bind().engine.url
    if url.get_backend_name() == "sqlite":
        return audit_text.Source("sqlite", str(Path(url.database or "").resolve()))
    target = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return audit_text.Source("postgresql", target, snapshot)


def _driver_connection(session: Session) -> Any:
    return session.connection().connection.driver_connection


def verify(
    session: Session, *, workers: int | None = None, chunk_rows: int = CHUNK_ROWS
) -> VerifyReport:
    """Walk the chain in id order and report the first row that does not hold up.

    A log of more than one `chunk_rows` range is checked by `workers` processes (default: one
    per CPU, up to `MAX_WORKERS`), a range each at a time, and the ranges linked here in
    order.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql" and not session.in_transaction():
        # The rows and the head must come from one snapshot, or a concurrent append between
        # the two reads would look like tampering.
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    # Only ids up to `high` are read: rows are append-only and a newer row gets a higher id,
    # so a range read later, by a worker on SQLite, holds the same rows as this snapshot.
    # On PostgreSQL the workers read inside this very snapshot.
    bounds = _bounds(session, export_snapshot=False)
    ranges = _ranges(bounds, chunk_rows)
    processes = _workers(session, workers, len(ranges))
    if processes and dialect == "postgresql":
        # Read again, in the very statement whose snapshot the workers share.
        bounds = _bounds(session, export_snapshot=True)
        ranges = _ranges(bounds, chunk_rows)
    with ExitStack() as stack:
        spans: Iterator[Span]
        if processes:
            source = _source(session, bounds.snapshot)
            pool = audit_workers.Workers(source, "verify", ranges, processes)
            stack.callback(pool.close)  # the workers stop with the first fault
            spans = audit_workers.spans(pool)
        else:
            raw = _driver_connection(session)
            spans = (audit_text.check(audit_text.rows(raw, dialect, *span)) for span in ranges)
        return _linked(spans, bounds.head)


def _linked(spans: Iterator[Span], head: tuple[int, str] | None) -> VerifyReport:
    """The report on the ranges' spans in id order: each linked to the one before, then the
    head checked against the last row."""
    checked = 0
    last_id, last_hash = 0, GENESIS_HASH
    for span in spans:
        if span.first is None:
            continue
        first_id, first_prev = span.first
        if first_id != last_id + 1:
            return _broken(checked, last_id + 1, f"audit row {last_id + 1} is missing")
        if first_prev != last_hash:
            problem = f"audit row {first_id} does not follow row {last_id}"
            return _broken(checked, first_id, problem)
        if span.fault is not None or span.last is None:
            bad_id, problem = span.fault or (first_id, "")
            return _broken(checked + span.checked, bad_id, problem)
        checked += span.checked
        last_id, last_hash = span.last
    if head is None:
        if checked:
            return _broken(checked, last_id, "the audit head row is missing")
        return VerifyReport(ok=True, checked=0)
    head_id, head_hash = head
    if head_id != last_id:
        return _broken(
            checked,
            min(head_id, last_id) + 1,
            f"the audit head points at row {head_id} but the last row is {last_id}",
        )
    if head_hash != last_hash:
        return _broken(checked, last_id, f"the audit head hash does not match row {last_id}")
    return VerifyReport(ok=True, checked=checked)


def _broken(checked: int, bad_id: int, problem: str) -> VerifyReport:
    return VerifyReport(ok=False, checked=checked, first_bad_id=bad_id, problem=problem)


def export(
    session: Session, fmt: ExportFormat, since: datetime | None = None
) -> Generator[str, None, None]:
    """The log (rows at or after `since`) as lines of CSV with a header, or of JSON."""
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"unknown audit export format {fmt!r}; use csv or jsonl")
    dialect = session.get_bind().dialect.name
    bounds = _bounds(session, export_snapshot=False)
    # One query, streamed: a million-row log never sits in memory.
    rows = audit_text.rows(_driver_connection(session), dialect, bounds.low, bounds.high, since)
    lines = audit_text.jsonl_lines(rows) if fmt == "jsonl" else audit_text.csv_lines(rows)
    # Closed with this generator: a reader that stops early leaves no server-side cursor open.
    with closing(rows), closing(lines):
        yield from lines


def export_blocks(
    session: Session,
    fmt: ExportFormat,
    since: datetime | None = None,
    *,
    workers: int | None = None,
    chunk_rows: int = EXPORT_CHUNK_ROWS,
) -> Generator[tuple[bytes, int], None, None]:
    """`export` in blocks of lines, UTF-8, each with the number of rows in it (the CSV header
    is a block of none). A log of more than one `chunk_rows` range is written by `workers`
    processes (default: one per CPU, up to `MAX_WORKERS`), a range each at a time, the blocks
    in order."""
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"unknown audit export format {fmt!r}; use csv or jsonl")
    bounds = _bounds(session, export_snapshot=False)
    ranges = _ranges(bounds, chunk_rows)
    processes = _workers(session, workers, len(ranges))
    if not processes:
        with closing(export(session, fmt, since)) as lines:
            yield from _blocks(lines, fmt)
        return
    if session.get_bind().dialect.name == "postgresql":
        # The workers read inside the snapshot of the statement that read the ids.
        bounds = _bounds(session, export_snapshot=True)
        ranges = _ranges(bounds, chunk_rows)
    if fmt == "csv":
        yield next(audit_text.csv_lines([])).encode(), 0
    pool = audit_workers.Workers(_source(session, bounds.snapshot), fmt, ranges, processes, since)
    try:
        for said, text in pool.answers():
            if said["rows"]:
                yield text, said["rows"]  # as the worker wrote it: nothing decoded here
    finally:
        pool.close()


def _blocks(lines: Iterator[str], fmt: ExportFormat) -> Generator[tuple[bytes, int], None, None]:
    if fmt == "csv":
        yield next(lines).encode(), 0
    while block := list(itertools.islice(lines, 1_000)):
        yield "".join(block).encode(), len(block)


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
