"""The admin command line: `gpubot rules check`, `db upgrade`, `audit verify|export`, `leases`,
`nodes`, `serve`, `demo` (the local Slack workspace) and `agent` (the node agent).

Exit status: 0 done, 1 the audit chain is broken, 2 the command could not do its job (bad input,
rule problems, an unreachable database). Expected failures print one line, never a traceback.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn, TextIO

import sqlalchemy as sa
import typer
from alembic.util.exc import CommandError
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from slack_bolt.error import BoltError

from bot import logs
from bot.rulesdir import RulesDirError, read_rules_dir
from bot.services import devices
from bot.services.queries import list_leases
from bot.services.views import LeaseView
from bot.settings import Settings
from bot.telemetry.errors import TelemetryError
from rules.domain import Subject, format_duration
from rules.engine.live import EngineName, build_engine, check
from rules.errors import PolicyError, Problem, RulesError
from rules.expr import parse_duration
from rules.loader import load_policy
from rules.policy import Policy
from storage import audit, migrate
from storage.db import Database

EXIT_BROKEN = 1
EXIT_FAILED = 2

app = typer.Typer(
    help="gpubot: run the bot (serve), the local Slack workspace (demo), the node agent "
    "(agent), and the admin commands: check rule files, migrate the database, verify and "
    "export the audit log, list leases.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain click-style errors: one greppable `Error:` line
    pretty_exceptions_enable=False,  # a bug prints a plain traceback, never local variables
)
rules_app = typer.Typer(help="Rule files.", no_args_is_help=True)
db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
audit_app = typer.Typer(help="The hash-chained audit log.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")
app.add_typer(db_app, name="db")
app.add_typer(audit_app, name="audit")


class EngineChoice(StrEnum):
    DURABLE = "durable"
    REFERENCE = "reference"


class ExportFormat(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"


DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="SQLAlchemy URL; default: GPUBOT_DATABASE_URL or sqlite:///gpubot.db",
        show_default=False,
    ),
]


def _fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(f"{_env_name(e['loc'])}: {e['msg']}" for e in exc.errors())
        _fail(f"invalid settings: {problems}")


def _env_name(loc: tuple[int | str, ...]) -> str:
    """The environment variable a settings error is about (GPUBOT_RULES_ENGINE, SLACK_...)."""
    name = str(loc[0]) if loc else "settings"
    field = Settings.model_fields.get(name)
    return name if field is None or field.alias else f"GPUBOT_{name.upper()}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# ---- rules ------------------------------------------------------------------------------


@rules_app.command("check")
def rules_check(
    directory: Annotated[
        Path | None,
        typer.Argument(help="rules directory; default: GPUBOT_RULES_DIR", show_default=False),
    ] = None,
    engine: Annotated[
        EngineChoice | None,
        typer.Option(help="engine to run the cases on; default: GPUBOT_RULES_ENGINE"),
    ] = None,
) -> None:
    """Validate the rule files and run their test cases, as a reload would."""
    settings = _settings()
    directory = settings.rules_dir if directory is None else directory
    prefer: EngineName = settings.rules_engine if engine is None else engine.value
    try:
        sources = read_rules_dir(directory)
    except OSError as exc:  # RulesDirError, or a file that cannot be read
        _fail(str(exc))
    except UnicodeDecodeError as exc:
        _fail(f"{directory}: a rule file is not UTF-8 text ({exc.reason})")
    try:
        policy = load_policy(sources)
    except PolicyError as exc:
        _report(directory, exc.problems, f"{_plural(len(exc.problems), 'problem')} in {directory}")
    try:
        rule_engine = build_engine(policy, prefer)
    except PolicyError as exc:
        _report(directory, exc.problems, f"the {prefer} engine refused {directory}")
    tail = f"revision {policy.revision}; engine {rule_engine.name}"
    cases = _plural(len(policy.cases), "case")
    try:
        check(policy, rule_engine)
    except PolicyError as exc:  # one located problem per failing case
        _report(directory, exc.problems, f"{len(exc.problems)} of {cases} failed; {tail}")
    except RulesError as exc:
        _fail(f"{directory}: running the test cases failed: {exc}")
    finally:
        rule_engine.close()
    typer.echo(f"OK: {_rule_counts(policy)}, {cases} passed; {tail}")


def _report(directory: Path, problems: Iterable[Problem], summary: str) -> NoReturn:
    """Each problem as `path:line:col: message`, the path joined to the directory."""
    for p in problems:
        # "(policy)"-style anchors name no file: point at the directory itself.
        path = directory if p.file.startswith("(") else directory / p.file
        typer.echo(f"{path}:{p.line}:{p.col}: {p.message}", err=True)
    typer.echo(f"FAILED: {summary}", err=True)
    raise typer.Exit(EXIT_FAILED)


def _rule_counts(policy: Policy) -> str:
    per = ", ".join(f"{len(policy.rules_for(s))} {s}" for s in Subject)
    return f"{_plural(len(policy.rules), 'rule')} ({per})"


# ---- database ---------------------------------------------------------------------------


def _shown(url: str) -> str:
    """The URL without its password, fit for a terminal."""
    return sa.make_url(url).render_as_string(hide_password=True)


@contextmanager
def _database_errors(url: str) -> Iterator[None]:
    """Turn the ways a database can be out of reach into one line and exit 2."""
    try:
        shown = _shown(url)
    except sa.exc.ArgumentError:
        _fail("bad database URL: expected e.g. sqlite:///gpubot.db or postgresql://user@host/db")
    try:
        yield
    except sa.exc.ArgumentError as exc:  # e.g. a dialect SQLAlchemy does not know
        _fail(f"bad database URL {shown}: {exc}")
    except ImportError as exc:
        _fail(f"no driver for {shown}: {exc} (PostgreSQL: pip install 'gpubot[postgres]')")
    except sa.exc.DBAPIError as exc:
        lines = str(exc.orig).strip().splitlines() or [type(exc.orig).__name__]
        _fail(f"cannot use the database at {shown}: {lines[0]}")
    except CommandError as exc:  # alembic: e.g. a revision this version does not know
        _fail(f"cannot migrate the database at {shown}: {exc}")


def _database_url(option: str | None) -> str:
    return option if option is not None else _settings().database_url


@contextmanager
def _migrated(url: str) -> Iterator[Database]:
    """The database at `url`, refused unless `gpubot db upgrade` has created its schema."""
    with _database_errors(url):
        missing = _missing_sqlite_file(url)
        if missing:  # connecting would create an empty file
            _fail(f"no database file at {missing}; run `gpubot db upgrade` first")
        if migrate.current(url) is None:
            _fail(f"the database at {_shown(url)} has no gpubot schema; run `gpubot db upgrade`")
        database = Database(url)
        try:
            yield database
        finally:
            database.dispose()


def _missing_sqlite_file(url: str) -> str | None:
    parsed = sa.make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or path in (None, "", ":memory:"):
        return None
    if parsed.query.get("mode") == "memory" or Path(path).exists():
        return None
    return path


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrl = None) -> None:
    """Create the schema or bring it up to date (safe to run again)."""
    url = _database_url(database_url)
    with _database_errors(url):
        before = migrate.current(url)
        migrate.upgrade(url)
        after = migrate.current(url)
    if before == after:
        typer.echo(f"OK: {_shown(url)} is already at schema revision {after}")
    else:
        typer.echo(
            f"OK: {_shown(url)} upgraded from {before or 'nothing'} to schema revision {after}"
        )


# ---- audit ------------------------------------------------------------------------------


@audit_app.command("verify")
def audit_verify(database_url: DatabaseUrl = None) -> None:
    """Walk the hash chain; exit 1 naming the first row that does not hold up."""
    url = _database_url(database_url)
    with _migrated(url) as database, database.read() as session:
        report = audit.verify(session)
    if not report.ok:
        typer.echo(
            f"FAILED: {report.problem} (first bad row id {report.first_bad_id}; "
            f"{_plural(report.checked, 'row')} before it intact)",
            err=True,
        )
        raise typer.Exit(EXIT_BROKEN)
    typer.echo(f"OK: {_plural(report.checked, 'audit row')}, hash chain intact")


def parse_since(text: str, now: datetime) -> datetime:
    """An ISO date or time (naive means UTC), or a duration back from `now` like 2d or 6h."""
    minutes = parse_duration(text)
    if minutes is not None:
        return now - timedelta(minutes=minutes)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since: expected an ISO date or time (2024-05-01, 2024-05-01T12:00, naive "
            f"means UTC) or a duration back from now (90m, 6h, 2d), got {text!r}"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _since(text: str | None) -> datetime | None:
    """A --since option read now, or a one-line failure that says what it expected."""
    if text is None:
        return None
    try:
        return parse_since(text, datetime.now(UTC))
    except ValueError as exc:
        _fail(str(exc))


@audit_app.command("export")
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
    start = _since(since)
    url = _database_url(database_url)
    with _migrated(url) as database, database.read() as session:
        lines = audit.export(session, fmt.value, start)
        if output is None:
            _write(lines, sys.stdout)
            return
        try:
            with output.open("w", encoding="utf-8", newline="") as stream:
                rows = _write(lines, stream)
        except OSError as exc:
            _fail(f"cannot write {output}: {exc.strerror or exc}")
    header = 1 if fmt == ExportFormat.CSV else 0
    typer.echo(f"wrote {_plural(rows - header, 'audit row')} to {output}", err=True)


def _write(lines: Iterable[str], stream: TextIO) -> int:
    count = 0
    for line in lines:
        stream.write(line)
        count += 1
    return count


# ---- leases -----------------------------------------------------------------------------


@app.command("leases")
def leases(
    show_all: Annotated[bool, typer.Option("--all", help="include ended leases")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """The active leases (or all of them), newest first."""
    url = _database_url(database_url)
    with _migrated(url) as database, database.read() as session:
        views = list_leases(session, active_only=not show_all)
    if not views:
        typer.echo("No leases." if show_all else "No active leases.")
        return
    table = lease_table(views, datetime.now(UTC))
    # Off a terminal rich assumes 80 columns and would fold cells; a pipe gets whole lines.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(table)


def lease_table(views: Iterable[LeaseView], now: datetime) -> Table:
    table = Table(title=None, show_edge=False, pad_edge=False)
    for name in ("lease", "holder", "team", "pool", "GPUs", "granted (UTC)", "expires (UTC)"):
        table.add_column(name, no_wrap=True)
    table.add_column("time left", no_wrap=True, justify="right")
    table.add_column("state", no_wrap=True)
    for view in views:
        table.add_row(
            view.code,
            view.holder,
            view.team,
            view.pool,
            " ".join(f"{node}:{','.join(map(str, idx))}" for node, idx in view.by_node.items()),
            _utc(view.granted_at),
            _utc(view.expires_at),
            _time_left(view, now),
            view.state,
        )
    return table


def _utc(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def _time_left(view: LeaseView, now: datetime) -> str:
    if view.state != "active":
        return "-"
    left = view.expires_at - now
    return format_duration(left) if left > timedelta(0) else f"overdue {format_duration(-left)}"


# ---- nodes ------------------------------------------------------------------------------


class NodesFormat(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSONL = "jsonl"


_GPU_FIELDS: tuple[str, ...] = (
    "node",
    "gpu",
    "pool",
    "state",
    "reporting",
    "drained",
    "model",
    "uuid",
    "driver",
    "cuda",
    "memory_mib",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "lease",
    "team",
    "processes_of",
    "since",
)
# The table a terminal can hold; csv and jsonl carry every field.
_TABLE_FIELDS: tuple[str, ...] = (
    "node",
    "gpu",
    "pool",
    "state",
    "lease",
    "team",
    "processes_of",
    "memory",
    "temperature_c",
    "power_w",
)
_INTERVAL_FIELDS: tuple[str, ...] = (
    "node",
    "gpu",
    "pool",
    "state",
    "team",
    "lease",
    "start",
    "end",
    "by",
    "detail",
)


@app.command("nodes")
def nodes(
    show_history: Annotated[
        bool,
        typer.Option(
            "--history",
            help="every device's lifecycle and lease intervals instead of the current state",
        ),
    ] = False,
    node: Annotated[str | None, typer.Option("--node", help="only this node")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="with --history: intervals reaching past an ISO date/time or 30d"),
    ] = None,
    fmt: Annotated[
        NodesFormat, typer.Option("--format", help="table (default), csv or jsonl")
    ] = NodesFormat.TABLE,
    database_url: DatabaseUrl = None,
) -> None:
    """Every node and GPU: where it stands, whether it reports, its profile; or its history."""
    if since is not None and not show_history:
        _fail("--since goes with --history: the current state has no time range")
    start = _since(since)
    url = _database_url(database_url)
    with _migrated(url) as database, database.read() as session:
        if node is not None and not devices.profiles(session, node):
            stray = devices.strays(session).get(node)
            if stray is not None and not show_history:
                _fail(
                    f"{node} is in no pool of pools.yaml, but it reported {stray} GPUs; "
                    f"`gpubot nodes --history --node {node}` shows when"
                )
            if stray is None:
                _fail(f"there is no node {node!r} in the database")
        if show_history:
            found = devices.intervals(session, start)
            rows = [_interval_row(i) for i in found if node is None or i.node == node]
            fields = _INTERVAL_FIELDS
        else:
            rows = [_gpu_row(n, g) for n in devices.profiles(session, node) for g in n.gpus]
            fields = _GPU_FIELDS if fmt != NodesFormat.TABLE else _TABLE_FIELDS
    _emit(rows, fields, fmt)


# Words for the command line: one per state, the same as the history's.
_STATE_WORDS = {"silent": "not-reporting"}


def _gpu_row(node: devices.NodeProfile, gpu: devices.GpuProfile) -> dict[str, object]:
    return {
        "node": node.name,
        "gpu": gpu.index,
        "pool": gpu.pool,
        "state": _STATE_WORDS.get(gpu.place, gpu.place),
        "reporting": _STATE_WORDS.get(node.reporting, node.reporting),
        "drained": node.drained,
        "model": gpu.model,
        "uuid": gpu.uuid,
        "driver": node.driver,
        "cuda": node.cuda,
        "memory_mib": gpu.memory_mib or None,
        "memory_used_mib": gpu.memory_used_mib,
        "memory": _memory(gpu.memory_used_mib, gpu.memory_mib),
        "temperature_c": gpu.temperature_c,
        "power_w": gpu.power_w,
        "lease": gpu.lease,
        "team": gpu.team,
        "processes_of": " ".join(gpu.occupants),
        "since": _iso(gpu.since),
    }


def _memory(used: int | None, total: int) -> str:
    def gib(mib: int | None) -> str:
        return "?" if mib is None else f"{mib / 1024:.0f}"

    return f"{gib(used)}/{gib(total or None)} GiB"


def _interval_row(interval: devices.Interval) -> dict[str, object]:
    return {
        "node": interval.node,
        "gpu": "" if interval.gpu is None else interval.gpu,
        "pool": interval.pool,
        "state": interval.state,
        "team": interval.team,
        "lease": interval.lease,
        "start": _iso(interval.start),
        "end": _iso(interval.end),
        "by": interval.by,
        "detail": json.dumps(dict(interval.detail), sort_keys=True, default=str),
    }


def _iso(when: datetime | None) -> str:
    return "" if when is None else when.astimezone(UTC).isoformat(timespec="seconds")


def _emit(rows: list[dict[str, object]], fields: tuple[str, ...], fmt: NodesFormat) -> None:
    if fmt == NodesFormat.JSONL:
        for row in rows:
            sys.stdout.write(json.dumps({f: row[f] for f in fields}, default=str) + "\n")
        return
    if fmt == NodesFormat.CSV:
        writer = csv.DictWriter(
            sys.stdout, fieldnames=fields, lineterminator="\n", extrasaction="ignore"
        )
        writer.writeheader()
        writer.writerows(rows)
        return
    if not rows:
        typer.echo("Nothing recorded yet.")
        return
    table = Table(title=None, show_edge=False, pad_edge=False)
    for name in fields:
        table.add_column(name.replace("_", " "), no_wrap=name in ("node", "gpu", "state"))
    for row in rows:
        table.add_row(*("" if row[f] is None else str(row[f]) for f in fields))
    console = Console() if sys.stdout.isatty() else Console(width=240)
    console.print(table)


# ---- serve ------------------------------------------------------------------------------


@app.command("serve")
def serve(
    http: Annotated[
        bool, typer.Option("--http", help="HTTP mode even when SLACK_APP_TOKEN is set")
    ] = False,
    host: Annotated[str, typer.Option(help="address to listen on in HTTP mode")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on in HTTP mode")] = 3000,
) -> None:
    """Run the bot: Socket Mode when SLACK_APP_TOKEN is set, else HTTP on /slack/events (with
    /healthz, /readyz and /livez). It migrates the database first and carries out what an
    earlier run acknowledged and did not finish."""
    from bot.main import SetupError  # noqa: PLC0415 - the Slack stack loads only to serve
    from bot.main import serve as run  # noqa: PLC0415

    settings = _settings()
    logs.setup(settings.log_level, settings.log_format)
    try:
        with _database_errors(settings.database_url):
            run(settings, http=http, host=host, port=port)
    except SetupError as exc:
        _fail(str(exc))
    except (PolicyError, RulesDirError) as exc:
        _fail(f"the rules in {settings.rules_dir} cannot be loaded:\n{exc}")
    except BoltError as exc:
        _fail(f"Slack refused the bot token at {settings.slack_api_url}: {exc}")
    except TelemetryError as exc:
        _fail(str(exc).splitlines()[0])


# ---- demo -------------------------------------------------------------------------------


@app.command("demo")
def demo(
    port: Annotated[int, typer.Option(help="port of the page, on 127.0.0.1 only")] = 8080,
) -> None:
    """Run the local Slack workspace: the real bot and a Slack-like page, no Slack needed."""
    from bot.main import SetupError  # noqa: PLC0415 - the Slack stack loads only to serve
    from bot.workspace.run import PortTakenError, run  # noqa: PLC0415

    settings = _settings()
    quiet = "WARNING" if "GPUBOT_LOG_LEVEL" not in os.environ else settings.log_level
    logs.setup(quiet, settings.log_format)  # the page is the demo's output, not the log
    try:
        run(port, typer.echo)
    except PortTakenError as exc:
        _fail(str(exc))
    except SetupError as exc:
        _fail(str(exc))
    except (PolicyError, RulesDirError) as exc:
        _fail(f"the default rules cannot be loaded:\n{exc}")
    except TelemetryError as exc:  # GPUBOT_FLEET naming a missing or malformed fleet file
        _fail(str(exc).splitlines()[0])
    except KeyboardInterrupt:
        typer.echo("demo stopped", err=True)


# ---- agent ------------------------------------------------------------------------------


@app.command("agent")
def agent(
    *,
    bot_url: Annotated[
        str, typer.Option("--bot-url", help="the bot's base URL, e.g. https://gpubot.lab:3000")
    ],
    token_file: Annotated[
        Path, typer.Option("--token-file", help="file holding this node's token (one line)")
    ],
    node: Annotated[
        str | None,
        typer.Option(help="node name as in pools.yaml; default: the host name", show_default=False),
    ] = None,
    interval: Annotated[str, typer.Option(help="time between polls, e.g. 30s or 1m")] = "30s",
    once: Annotated[bool, typer.Option("--once", help="push one poll, then exit")] = False,
    simulated: Annotated[
        Path | None,
        typer.Option(
            metavar="FLEET", help="replay a fleet file instead of reading NVML (tests, demo)"
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="report what enforcement orders would signal; signal nothing"
        ),
    ] = False,
    min_uid: Annotated[
        int,
        typer.Option(
            "--min-uid",
            min=0,
            help="never signal a process with any uid below this one (system accounts are "
            "never signalled either)",
        ),
    ] = 1000,
) -> None:
    """Run the node agent: poll this node's GPUs and push the samples to the bot, signed."""
    from bot.agent.run import AgentError, run_agent  # noqa: PLC0415 - NVML loads only for the agent

    minutes = parse_duration(interval)
    if minutes is None or minutes <= 0:
        _fail(f"--interval: expected a duration like 30s or 1m, got {interval!r}")
    settings = _settings()
    logs.setup(settings.log_level, settings.log_format)
    try:
        run_agent(
            bot_url,
            token_file,
            node=node,
            interval=timedelta(minutes=minutes),
            once=once,
            simulated=simulated,
            dry_run=dry_run,
            min_uid=min_uid,
        )
    except AgentError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("agent stopped", err=True)


def main() -> None:
    """The `gpubot` console script."""
    app()
