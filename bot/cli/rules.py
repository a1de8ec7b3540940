"""`gpubot rules check`: validate the rule files and run their test cases, as a reload would;
`gpubot rules simulate`: replay the recorded history through candidate rule files."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from bot.cli.common import (
    EXIT_FAILED,
    DatabaseUrl,
    database_errors,
    fail,
    migrated,
    parse_since,
    plural,
    read_settings,
    resolved_url,
)
from bot.services import simulate
from bot.services.rule_files import read_rules_dir
from rules.domain import Subject
from rules.engine.live import EngineName, build_engine, check
from rules.errors import PolicyError, Problem, RulesError
from rules.loader import load_policy
from rules.policy import Policy
from rules.quota import unstated

app = typer.Typer(help="Rule files.", no_args_is_help=True)


class EngineChoice(StrEnum):
    DURABLE = "durable"
    REFERENCE = "reference"


@app.command("check")
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
    """Validate the rule files and run their test cases, as a reload would; warn when they
    never state a quota limit (the code enforces it anyway)."""
    settings = read_settings()
    directory = settings.rules_dir if directory is None else directory
    prefer: EngineName = settings.rules_engine if engine is None else engine.value
    policy = _load(directory)
    try:
        rule_engine = build_engine(policy, prefer)
    except PolicyError as exc:
        _report(directory, exc.problems, f"the {prefer} engine refused {directory}")
    tail = f"revision {policy.revision}; engine {rule_engine.name}"
    cases = plural(len(policy.cases), "case")
    try:
        check(policy, rule_engine)
    except PolicyError as exc:  # one located problem per failing case
        _report(directory, exc.problems, f"{len(exc.problems)} of {cases} failed; {tail}")
    except RulesError as exc:
        fail(f"{directory}: running the test cases failed: {exc}")
    finally:
        rule_engine.close()
    for warning in unstated(policy):  # a warning, not a failure: the code holds the limit
        typer.echo(f"{directory}: warning: {warning}", err=True)
    typer.echo(f"OK: {_rule_counts(policy)}, {cases} passed; {tail}")


def _load(directory: Path) -> Policy:
    """The policy in `directory`, or exit 2 naming each problem's file and line."""
    try:
        sources = read_rules_dir(directory)
    except OSError as exc:  # RulesDirError, or a file that cannot be read
        fail(str(exc))
    except UnicodeDecodeError as exc:
        fail(f"{directory}: a rule file is not UTF-8 text ({exc.reason})")
    try:
        return load_policy(sources)
    except PolicyError as exc:
        _report(directory, exc.problems, f"{plural(len(exc.problems), 'problem')} in {directory}")


class Format(StrEnum):
    TABLE = "table"
    JSONL = "jsonl"


@app.command("simulate")
def rules_simulate(
    candidate: Annotated[Path, typer.Argument(help="the candidate rules directory")],
    since: Annotated[str, typer.Option(help="how far back: 30d, 12h, or an ISO date")] = "30d",
    output: Annotated[Format, typer.Option("--format", help="table or jsonl")] = Format.TABLE,
    in_force: Annotated[
        Path | None,
        typer.Option(help="the rules in force; default: GPUBOT_RULES_DIR", show_default=False),
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Replay the requests and telemetry recorded since --since through the candidate rules
    next to the rules in force, and print what would differ."""
    now = datetime.now(UTC)
    try:
        start = parse_since(since, now)
    except ValueError as exc:
        fail(str(exc))
    if start >= now:
        fail(f"--since: {since!r} is not in the past")
    settings = read_settings()
    current = _load(settings.rules_dir if in_force is None else in_force)
    proposed = _load(candidate)
    _warn_failing_cases(candidate, proposed)
    url = resolved_url(database_url)
    with migrated(url) as db, database_errors(url):
        sim = simulate.simulate(db, current, proposed, since=start, until=now)
        simulate.remember(db, sim, at=now, by="gpubot rules simulate")
    lines = simulate.jsonl(sim) if output == Format.JSONL else simulate.table(sim)
    for line in lines:
        typer.echo(line)


def _warn_failing_cases(directory: Path, policy: Policy) -> None:
    """A candidate whose own cases fail is still simulated; a reload would refuse it."""
    engine = build_engine(policy, "reference")
    try:
        check(policy, engine)
    except PolicyError as exc:
        for p in exc.problems:
            typer.echo(f"{directory / p.file}:{p.line}:{p.col}: warning: {p.message}", err=True)
        failing = len(exc.problems)
        verb = "fails" if failing == 1 else "fail"
        typer.echo(
            f"warning: {plural(failing, 'case')} of {directory} {verb}: a reload would refuse "
            "this revision",
            err=True,
        )
    finally:
        engine.close()


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
    return f"{plural(len(policy.rules), 'rule')} ({per})"
