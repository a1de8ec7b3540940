"""`gpubot` itself: --version, -h beside --help on every command, and a reader that closes
the pipe early (`gpubot audit export … | head -1`) ends the command quietly with exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from importlib.metadata import version

import pytest

from storage import audit
from storage.db import Database
from tests.unit.bot.cli.builders import GPUBOT, gpubot
from tests.unit.bot.cli.test_audit import an_entry

COMMANDS = [
    [],
    ["rules"],
    ["rules", "check"],
    ["db"],
    ["db", "upgrade"],
    ["audit"],
    ["audit", "verify"],
    ["audit", "export"],
    ["leases"],
    ["nodes"],
    ["org"],
    ["org", "lookup"],
    ["serve"],
    ["demo"],
    ["agent"],
]


def test_version_prints_the_package_version() -> None:
    """`gpubot --version`: one line from the package metadata, exit 0."""
    result = gpubot("--version")
    assert (0, f"gpubot {version('gpubot')}\n") == (result.exit_code, result.stdout)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "gpubot")
def test_dash_h_is_the_help_of_every_command(command: list[str]) -> None:
    """-h prints exactly what --help prints, for the root and every command."""
    short, long = gpubot(*command, "-h"), gpubot(*command, "--help")
    assert (0, 0) == (short.exit_code, long.exit_code), short.output
    assert short.stdout.startswith(f"Usage: gpubot {' '.join(command)}".rstrip())
    assert long.stdout == short.stdout


def many_rows(database: Database, count: int) -> None:
    """Far more audit rows than a pipe holds, so the writer meets the closed pipe."""
    with database.write() as session:
        for n in range(count):
            audit.append(session, an_entry(n), at=datetime(2025, 3, 14, tzinfo=UTC))


def environment(url: str, *, buffered: bool) -> dict[str, str]:
    """The script's environment: the database, and stdout buffered or not (PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return {**env, "GPUBOT_DATABASE_URL": url} | ({} if buffered else {"PYTHONUNBUFFERED": "1"})


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_audit_export_into_a_pipe_closed_early_exits_0_without_a_word(
    url: str, database: Database, fmt: str, buffered: bool
) -> None:
    """`gpubot audit export | head -1`: the reader takes a line and goes; the export stops
    with exit 0 and nothing on stderr (exit 1 means a broken chain, not a closed pipe)."""
    many_rows(database, 2_000)
    env = environment(url, buffered=buffered)
    with subprocess.Popen(  # noqa: S603  (our own console script, fixed arguments)
        [str(GPUBOT), "audit", "export", "--format", fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as export:
        assert export.stdout is not None
        assert export.stderr is not None
        first = export.stdout.readline()
        export.stdout.close()  # what `head -1` does once it has its line
        stderr = export.stderr.read()
        code = export.wait(timeout=120)
    assert first.startswith(b'{"actor":"U0"' if fmt == "jsonl" else b"id,at,actor")
    assert (0, b"") == (code, stderr)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_leases_into_a_pipe_closed_before_it_writes_exits_0_without_a_word(
    url: str, buffered: bool
) -> None:
    """A reader gone before the first byte is written: still exit 0 and a quiet stderr."""
    read, write = os.pipe()
    os.close(read)
    env = environment(url, buffered=buffered)
    try:
        done = subprocess.run(  # noqa: S603  (our own console script, fixed arguments)
            [str(GPUBOT), "leases"],
            stdout=write,
            stderr=subprocess.PIPE,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (0, b"") == (done.returncode, done.stderr)


# A command that writes without flushing, then ends with its own status.
WRITES_THEN_EXITS = """
import sys
import typer
from bot.cli.app import _QuietPipeGroup

app = typer.Typer(cls=_QuietPipeGroup)

@app.command()
def broken() -> None:
    sys.stdout.write("a line the reader never takes\\n")
    raise typer.Exit(1)

@app.command()
def other() -> None:
    pass

app()
"""


def test_a_closed_pipe_keeps_a_commands_own_exit_status() -> None:
    """Output still buffered when a command exits 1 meets the closed pipe: the status stays 1
    (a broken chain stays a broken chain) and Python says nothing about the pipe."""
    read, write = os.pipe()
    os.close(read)
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        done = subprocess.run(  # noqa: S603  (this interpreter, fixed arguments)
            [sys.executable, "-c", WRITES_THEN_EXITS, "broken"],
            stdout=write,
            stderr=subprocess.PIPE,
            env=buffered,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (1, b"") == (done.returncode, done.stderr)
