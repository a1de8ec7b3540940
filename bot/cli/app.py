"""The `gpubot` command line: `rules check`, `db upgrade`, `audit verify|export`, `leases`,
`nodes`, `org lookup`, `serve`, `demo` (the local Slack workspace) and `agent` (the node agent),
put together from the modules of bot/cli. Exit codes are in bot/cli/common.py.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from bot.cli import audit, db, leases, nodes, org, processes, report, rules


class _QuietPipeGroup(TyperGroup):
    """`gpubot … | head`: a reader that closes the pipe early ends the command quietly with
    exit 0 (Python's SIGPIPE recipe), never a traceback, and never exit 1, which says the
    audit chain is broken. A command that ends with its own exit status keeps it."""

    def invoke(self, ctx: Any) -> Any:
        try:
            done = super().invoke(ctx)
        except BrokenPipeError:
            _drop_stdout()
            raise typer.Exit(0) from None
        except BaseException:
            _flush_or_drop()  # the status stands; what a closed pipe did not take is dropped
            raise
        if not _flush_or_drop():  # what is still buffered meets the closed pipe here
            raise typer.Exit(0)
        return done


def _flush_or_drop() -> bool:
    """Flush stdout; False when its reader has gone (the rest then goes nowhere)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
        return False
    return True


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so Python's own flush at exit finds no closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


app = typer.Typer(
    cls=_QuietPipeGroup,
    help="gpubot: run the bot (serve), the local Slack workspace (demo), the node agent "
    "(agent), and the admin commands: check rule files, migrate the database, verify and "
    "export the audit log, list leases and nodes, look people up in Slack for org.yaml.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
    rich_markup_mode=None,  # plain click-style errors: one greppable `Error:` line
    pretty_exceptions_enable=False,  # a bug prints a plain traceback, never local variables
)
app.add_typer(rules.app, name="rules")
app.add_typer(db.app, name="db")
app.add_typer(audit.app, name="audit")
app.add_typer(org.app, name="org")
app.add_typer(report.app, name="report")
app.command("leases")(leases.leases)
app.command("nodes")(nodes.nodes)
app.command("serve")(processes.serve)
app.command("demo")(processes.demo)
app.command("agent")(processes.agent)


def package_version() -> str:
    """The installed gpubot's version, from its package metadata."""
    try:
        return version("gpubot")
    except PackageNotFoundError:  # run from a tree that was never installed
        return "unknown (not installed)"


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"gpubot {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="print gpubot's version and exit",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """The options of `gpubot` itself; the commands do the work."""


def main() -> None:
    """The `gpubot` console script."""
    app()
