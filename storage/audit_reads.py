"""The audit table's stored rows read one range of ids at a time, as the bytes stored (nothing
decoded), through a connection of the reader's own: what `verify` checks and `export` writes,
in this process or in a worker (storage/audit_workers.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from storage.audit_text import HEADER, Row, stored_at

#: A read of the stored bytes (UTF-8, nothing decoded), in `HEADER` order: the id, the time as
#: "YYYY-MM-DD HH:MM:SS.ffffff" (UTC), the text and JSON columns.
_COLUMNS = {
    "sqlite": ", ".join(
        [
            "id",
            *(f"CAST({name} AS BLOB)" for name in HEADER[1:]),
        ]
    ),
    # Text and JSON columns as they are sent, read as bytes (`_AS_BYTES`): the server
    # converts nothing, and nothing is decoded here.
    "postgresql": ", ".join(
        [
            "id",
            "to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
            *HEADER[2:],
        ]
    ),
}
#: The PostgreSQL types `_COLUMNS` reads, loaded as the bytes the server sent.
_AS_BYTES = ("text", "varchar", "json")
_MARK = {"sqlite": "?", "postgresql": "%s"}
_BATCH = 1_000  # rows fetched at a time: memory stays flat whatever the size of the log


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
        # The text arrives as the server sends it, in the client's encoding: the hash covers
        # UTF-8 (a LATIN1 client would make every accented name look altered).
        connection.execute("SET client_encoding TO 'UTF8'")
        # A server-side cursor: PostgreSQL sends the rows a batch at a time.
        cursor = connection.cursor(name=f"audit_{low}_{high}", binary=True)
        for name in _AS_BYTES:
            cursor.adapters.register_loader(name, _bytes_loader())
        cursor.itersize = _BATCH
    else:
        cursor = connection.cursor()
    try:
        cursor.execute(_query(dialect, since is not None), params)
        while batch := cursor.fetchmany(_BATCH):
            yield from batch
    finally:
        cursor.close()


def _bytes_loader() -> type:
    from psycopg.types.string import ByteaBinaryLoader  # noqa: PLC0415  (see `connect`)

    return ByteaBinaryLoader


def connect(source: Source) -> Any:
    """A connection of the worker's own, read-only, inside the verify's snapshot."""
    if source.dialect == "sqlite":
        uri = f"{Path(source.target).resolve().as_uri()}?mode=ro"
        return sqlite3.connect(uri, uri=True, timeout=30)
    # Imported here: a worker on SQLite starts without it (a fifth of a second).
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    connection = psycopg.connect(source.target)
    connection.read_only = True
    if source.snapshot:
        connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snapshot = sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(source.snapshot))
        connection.execute(snapshot)
    return connection
