"""`gpubot audit verify|export`: walk the hash chain; write the log as CSV or JSON lines."""

from __future__ import annotations

import sys
from collections.abc import Generator
from contextlib import closing
from enum import StrEnum
from pathlib import Path
from typing import Annotated, BinaryIO

import typer

from bot.cli.common import (
    EXIT_BROKEN,
    DatabaseUrl,
    fail,
    migrated,
    plural,
    resolved_url,
    since_option,
)
from storage import audit
from storage.audit_workers import WorkerError

app = typer.Typer(help="The hash-chained audit log.", no_args_is_help=True)


class ExportFormat(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"


@app.command("verify")
def audit_verify(database_url: DatabaseUrl = None) -> None:
    """Walk the hash chain; exit 1 naming the first row that does not hold up."""
    url = resolved_url(database_url)
    with migrated(url) as database, database.read() as session:
        try:
            report = audit.verify(session)
        except WorkerError as exc:
            fail(str(exc))
    if not report.ok:
        typer.echo(
            f"FAILED: {report.problem} (first bad row id {report.first_bad_id}; "
            f"{plural(report.checked, 'row')} before it intact)",
            err=True,
        )
        raise typer.Exit(EXIT_BROKEN)
    typer.echo(f"OK: {plural(report.checked, 'audit row')}, hash chain intact")


@app.command("export")
def audit_export(
    fmt: Annotated[ExportFormat, typer.Option("--format", help="csv or jsonl")],
    since: Annotated[
        str | None,
        typer.Option(help="only rows at or after: an ISO date/time (UTC) or a duration like 2d"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="file to write; default: stdout")
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Write the audit log (or its rows since a time) as CSV or JSON lines."""
    start = since_option(since)
    url = resolved_url(database_url)
    with migrated(url) as database, database.read() as session:
        try:
            if output is None:
                sys.stdout.flush()  # what was written as text goes first
                # A closed pipe: the command group's to handle.
                _write(audit.export_blocks(session, fmt.value, start), sys.stdout.buffer)
                return
            try:
                with output.open("wb") as stream:
                    # A big log's blocks go from the worker processes into the file directly.
                    blocks = audit.export_blocks(session, fmt.value, start, into=stream.fileno())
                    rows = _write(blocks, stream)
            except OSError as exc:
                fail(f"cannot write {output}: {exc.strerror or exc}")
        except (ValueError, WorkerError) as exc:  # a row that cannot be read, a worker gone
            fail(str(exc))
    typer.echo(f"wrote {plural(rows, 'audit row')} to {output}", err=True)


def _write(blocks: Generator[tuple[bytes, int], None, None], stream: BinaryIO) -> int:
    """Write the blocks of UTF-8 lines as they come (no decoding); the rows written. Closes
    the blocks, whose worker processes stop, before the session they read in."""
    count = 0
    with closing(blocks):
        for text, rows in blocks:
            if text:  # else already in the file (`audit.export_blocks`'s `into`)
                stream.write(text)
                stream.flush()
            count += rows
    return count
