"""The audit table read as stored text, one range of ids at a time: the rows `verify` checks and
`export` writes, without decoding a JSON column whose stored text is already what was hashed.

A row's hash covers the canonical JSON of its columns. Rows are stored with their JSON columns
as that canonical text, so the hashed body is the stored text put together; a row whose text is
not canonical (written before rows were stored that way, or by hand) is decoded and encoded
again, as every row once was. Each row stores its previous hash, so a range of ids is checked
on its own (in a worker process for a big log) and the ranges are linked afterwards, in order.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sqlite3
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from json.encoder import encode_basestring  # the C one where the interpreter has it
from typing import Any

import psycopg
from psycopg import sql

#: A read of the stored text, in this order: id, at (as "YYYY-MM-DD HH:MM:SS.ffffff", UTC),
#: the text columns and the JSON columns as text, then whether the JSON texts are well formed.
#: PostgreSQL's json type refuses malformed text on the way in; SQLite stores any text, and
#: malformed pieces could be shifted between columns without changing what they add up to.
_COLUMNS = {
    "sqlite": (
        "id, at, actor, tag, subject, outcome, deciding_rule, matching_rules, facts, detail, "
        "revision, engine, prev_hash, hash, "
        "json_valid(matching_rules) AND json_valid(facts) AND json_valid(detail)"
    ),
    "postgresql": (
        "id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), actor, tag, subject, "
        "outcome, deciding_rule, matching_rules::text, facts::text, detail::text, revision, "
        "engine, prev_hash, hash, true"
    ),
}
_MARK = {"sqlite": "?", "postgresql": "%s"}
_BATCH = 1_000  # rows fetched at a time: memory stays flat whatever the size of the log
HEADER = (
    "id",
    "at",
    "actor",
    "tag",
    "subject",
    "outcome",
    "deciding_rule",
    "matching_rules",
    "facts",
    "detail",
    "revision",
    "engine",
    "prev_hash",
    "hash",
)

Row = Sequence[Any]


def _json_default(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    raise TypeError(f"{type(value).__name__} cannot go into the audit log: {value!r}")


def canonical_json(value: object) -> str:
    """The one serialisation hashes are computed over: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=_json_default,
    )


def plain(value: object) -> Any:
    """`value` as JSON reads it back: tuples, sets, dates and non-str keys become what JSON
    makes of them, so the row read from the database hashes the same. (Not sorted here: keys
    of mixed types cannot be sorted before they are strings.)"""
    return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_default))


def body_parts(values: Sequence[str]) -> tuple[str, str]:
    """A row's hashed body, canonical JSON with its keys in sorted order, split where the
    export's "hash" key goes (after "facts"). `values` are the hashed columns in `HEADER`
    order (id to prev_hash), each already encoded as canonical JSON."""
    (
        row_id,
        at,
        actor,
        tag,
        subject,
        outcome,
        rule,
        rules,
        facts,
        detail,
        revision,
        engine,
        prev_hash,
    ) = values
    head = (
        f'{{"actor":{actor},"at":{at},"deciding_rule":{rule},"detail":{detail},'
        f'"engine":{engine},"facts":{facts}'
    )
    tail = (
        f',"id":{row_id},"matching_rules":{rules},"outcome":{outcome},'
        f'"prev_hash":{prev_hash},"revision":{revision},"subject":{subject},"tag":{tag}}}'
    )
    return head, tail


def digest(prev_hash: str, body: str) -> str:
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


def stored_at(at: datetime) -> str:
    """How an aware time reads back from either database through `_COLUMNS`."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _iso(at: str) -> str:
    """The stored time as `datetime.isoformat` writes it in UTC (what the hash covers)."""
    moment = datetime.fromisoformat(at)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def _stored_parts(row: Row) -> tuple[str, str, str]:
    """The time in ISO form and the body's head and tail (see `body_parts`) from a row's
    stored text as it is: what was hashed, if the row was stored canonical. Raises TypeError
    or ValueError for a value of another type or a time in another spelling."""
    at = row[1]
    if len(at) != 26 or at[19] != ".":
        raise ValueError("a time in another spelling")
    iso = f"{at[:10]}T{at[11:19]}{'' if at[20:] == '000000' else at[19:]}+00:00"
    e = encode_basestring  # the time has only digits and -:T+. in it: nothing to escape
    head = (
        f'{{"actor":{e(row[2])},"at":"{iso}","deciding_rule":{e(row[6])},"detail":{row[9]},'
        f'"engine":{e(row[11])},"facts":{row[8]}'
    )
    tail = (
        f',"id":{row[0]:d},"matching_rules":{row[7]},"outcome":{e(row[5])},'
        f'"prev_hash":{e(row[12])},"revision":{e(row[10])},"subject":{e(row[4])},'
        f'"tag":{e(row[3])}}}'
    )
    return iso, head, tail


def _decoded_parts(row: Row) -> tuple[str, str, str] | None:
    """The same from the row's values decoded and encoded again, as every row once was; None
    when they cannot be decoded (nothing hashes to what cannot be read)."""
    try:
        iso = _iso(row[1])
        decoded = [json.loads(row[i]) for i in (7, 8, 9)]
        values = [row[0], iso, *row[2:7], *decoded, *row[10:13]]
        return iso, *body_parts([canonical_json(value) for value in values])
    except (TypeError, ValueError):
        return None


def is_stored_hash(row: Row) -> bool:
    """Whether the row's stored text is what its hash covers, as written since rows are
    stored canonical; the JSON texts well formed, so none can hide part of another."""
    try:
        return bool(row[14]) and digest(row[12], "".join(_stored_parts(row)[1:])) == row[13]
    except (TypeError, ValueError):
        return False


class _Parts:
    """One row's time and body for its export line: from its stored text when that is what
    was hashed (`canonical`), else from its values decoded and encoded again."""

    __slots__ = ("at", "canonical", "head", "row", "tail")

    def __init__(self, row: Row) -> None:
        self.row = row
        self.canonical = is_stored_hash(row)
        parts = _stored_parts(row) if self.canonical else _decoded_parts(row)
        if parts is None:
            raise ValueError(
                f"audit row {row[0]} cannot be exported: its time or JSON columns do not "
                "parse (`gpubot audit verify` names what was altered)"
            )
        self.at, self.head, self.tail = parts

    def json_value(self, index: int) -> str:
        """A JSON column's canonical text."""
        if self.canonical:
            return str(self.row[index])
        return canonical_json(json.loads(self.row[index]))


# ---- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where a worker process reads from: its own connection to the same database, inside the
    snapshot the verify took (PostgreSQL), or bounded by the ids read in it (SQLite)."""

    dialect: str
    target: str  # the SQLite file, or a libpq connection string
    snapshot: str = ""  # pg_export_snapshot() of the reading transaction


def _query(dialect: str, since: bool) -> str:
    mark = _MARK[dialect]
    where = f"id > {mark} AND id <= {mark}" + (f" AND at >= {mark}" if since else "")
    return f"SELECT {_COLUMNS[dialect]} FROM audit WHERE {where} ORDER BY id"  # noqa: S608  (constants only)


def rows(
    connection: Any, dialect: str, low: int, high: int, since: datetime | None = None
) -> Generator[Row, None, None]:
    """The stored rows with `low < id <= high` (and `at >= since`) in id order, streamed."""
    params: list[Any] = [low, high]
    if since is not None:
        params.append(stored_at(since) if dialect == "sqlite" else since)
    if dialect == "postgresql":
        # A server-side cursor: PostgreSQL sends the rows a batch at a time.
        cursor = connection.cursor(name=f"audit_{low}_{high}")
        cursor.itersize = _BATCH
    else:
        cursor = connection.cursor()
    try:
        cursor.execute(_query(dialect, since is not None), params)
        while batch := cursor.fetchmany(_BATCH):
            yield from batch
    finally:
        cursor.close()


def connect(source: Source) -> Any:
    """A connection of the worker's own, read-only, inside the verify's snapshot."""
    if source.dialect == "sqlite":
        return sqlite3.connect(f"file:{source.target}?mode=ro", uri=True, timeout=30)
    connection = psycopg.connect(source.target)
    connection.read_only = True
    if source.snapshot:
        connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snapshot = sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(source.snapshot))
        connection.execute(snapshot)
    return connection


# ---- verifying a range ---------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """What one range of ids holds: its first and last row, how many rows check out before its
    first fault, and that fault. The first row's id and previous hash are for whoever links
    this range to the one before; every other row was linked here."""

    checked: int = 0
    first: tuple[int, str] | None = None  # (id, prev_hash)
    last: tuple[int, str] | None = None  # (id, hash)
    fault: tuple[int, str] | None = None  # (first bad id, problem)


def check(rows: Iterable[Row]) -> Span:
    """Check the rows of one range: ids without gaps, each row linked to the one before it,
    each row's hash over its content."""
    first: tuple[int, str] | None = None
    last_id, last_hash = 0, ""
    checked = 0
    for row in rows:
        row_id, prev_hash, row_hash = row[0], row[12], row[13]
        if first is None:
            first = (row_id, prev_hash)
        else:
            if row_id != last_id + 1:
                return Span(
                    checked, first, None, (last_id + 1, f"audit row {last_id + 1} is missing")
                )
            if prev_hash != last_hash:
                problem = f"audit row {row_id} does not follow row {last_id}"
                return Span(checked, first, None, (row_id, problem))
        if not is_stored_hash(row):
            parts = _decoded_parts(row)
            if parts is None or digest(prev_hash, parts[1] + parts[2]) != row_hash:
                return Span(checked, first, None, (row_id, f"audit row {row_id} was altered"))
        checked += 1
        last_id, last_hash = row_id, row_hash
    return Span(checked, first, (last_id, last_hash) if first else None)


def check_range(source: Source, span: tuple[int, int]) -> Span:
    """`check` of `low < id <= high` on a connection of this (worker) process's own."""
    connection = connect(source)
    try:
        return check(rows(connection, source.dialect, *span))
    finally:
        connection.close()


# ---- export lines --------------------------------------------------------------------------


def jsonl_lines(rows: Iterable[Row]) -> Generator[str, None, None]:
    """One canonical JSON object per row, its hash included."""
    for row in rows:
        parts = _Parts(row)
        yield f'{parts.head},"hash":{encode_basestring(row[13])}{parts.tail}\n'


def csv_lines(rows: Iterable[Row]) -> Generator[str, None, None]:
    """The header, then one CSV record per row, its JSON columns as canonical JSON text."""
    out: list[str] = []
    writer = csv.writer(_Sink(out.append), lineterminator="\n")
    writer.writerow(HEADER)
    yield out.pop()
    for row in rows:
        parts = _Parts(row)
        json_texts = [parts.json_value(i) for i in (7, 8, 9)]
        writer.writerow([row[0], parts.at, *row[2:7], *json_texts, *row[10:14]])
        yield out.pop()


class _Sink:
    """A file for csv.writer that hands each record over instead of buffering it."""

    def __init__(self, write: Callable[[str], object]) -> None:
        self.write = write
