"""Reading the audit chain back: `verify` walks it and `export` writes it, streamed, a big log
range by range in worker processes (storage/audit_workers.py) that read the rows as stored
(storage/audit_text.py). Imported through `storage.audit`, where the chain is written.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Generator, Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Session

from storage import audit_reads, audit_text, audit_workers
from storage.audit_text import GENESIS_HASH, HEAD_ID, Span
from storage.tables import AuditHeadRow, AuditRow

ExportFormat = Literal["csv", "jsonl"]
#: Rows per range of ids: the unit a worker process checks, its fetches streamed in batches.
CHUNK_ROWS = 50_000
#: The most worker processes a verify or export starts unless told (`workers=`).
MAX_WORKERS = 8
#: Rows per range an export worker writes: it holds the range's lines until they are read.
EXPORT_CHUNK_ROWS = 10_000

_audit = AuditRow.__table__  # type: ignore[attr-defined]  # SQLModel sets it at class creation
_head = AuditHeadRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    checked: int
    first_bad_id: int | None = None
    problem: str = ""


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
    head = sa.select(_head.c.last_id, _head.c.last_hash).where(_head.c.id == HEAD_ID).subquery()
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


def _source(session: Session, snapshot: str) -> audit_reads.Source:
    url = session.get_bind().engine.url
    if url.get_backend_name() == "sqlite":
        return audit_reads.Source("sqlite", str(Path(url.database or "").resolve()))
    target = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return audit_reads.Source("postgresql", target, snapshot)


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
            spans = (audit_text.check(audit_reads.rows(raw, dialect, *span)) for span in ranges)
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
    rows = audit_reads.rows(_driver_connection(session), dialect, bounds.low, bounds.high, since)
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
    into: int | None = None,
) -> Generator[tuple[bytes, int], None, None]:
    """`export` in blocks of lines, UTF-8, each with the number of rows in it (the CSV header
    is a block of none). A log of more than one `chunk_rows` range is written by `workers`
    processes (default: one per CPU, up to `MAX_WORKERS`), a range each at a time, the blocks
    in order.

    With `into` (the file descriptor the blocks go to), a worker's block is moved there by the
    kernel instead of being read into this process, and comes as b"" once it is written: the
    caller writes the other blocks, and flushes each before asking for the next."""
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
        for said, text in pool.answers(into):
            if said["rows"]:
                yield text, said["rows"]  # as the worker wrote it: nothing decoded here
    finally:
        pool.close()


def _blocks(lines: Iterator[str], fmt: ExportFormat) -> Generator[tuple[bytes, int], None, None]:
    if fmt == "csv":
        yield next(lines).encode(), 0
    while block := list(itertools.islice(lines, 1_000)):
        yield "".join(block).encode(), len(block)
