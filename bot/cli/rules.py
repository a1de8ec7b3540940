"""`gpubot rules check`: validate the rule files and run their test cases, as a reload would."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from bot.cli.common import EXIT_FAILED, fail, plural, read_settings
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
    try:
        sources = read_rules_dir(directory)
    except OSError as exc:  # RulesDirError, or a file that cannot be read
        fail(str(exc))
    except UnicodeDecodeError as exc:
        fail(f"{directory}: a rule file is not UTF-8 text ({exc.reason})")
    try:
        policy = load_policy(sources)
    except PolicyError as exc:
        _report(directory, exc.problems, f"{plural(len(exc.problems), 'problem')} in {directory}")
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
