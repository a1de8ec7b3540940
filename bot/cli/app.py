"""The `gpubot` command line: `rules check`, `db upgrade`, `audit verify|export`, `leases`,
`nodes`, `serve`, `demo` (the local Slack workspace) and `agent` (the node agent), put together
from the modules of bot/cli. Exit codes are in bot/cli/common.py.
"""

from __future__ import annotations

import typer

from bot.cli import audit, db, leases, nodes, processes, rules

app = typer.Typer(
    help="gpubot: run the bot (serve), the local Slack workspace (demo), the node agent "
    "(agent), and the admin commands: check rule files, migrate the database, verify and "
    "export the audit log, list leases.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain click-style errors: one greppable `Error:` line
    pretty_exceptions_enable=False,  # a bug prints a plain traceback, never local variables
)
app.add_typer(rules.app, name="rules")
app.add_typer(db.app, name="db")
app.add_typer(audit.app, name="audit")
app.command("leases")(leases.leases)
app.command("nodes")(nodes.nodes)
app.command("serve")(processes.serve)
app.command("demo")(processes.demo)
app.command("agent")(processes.agent)


def main() -> None:
    """The `gpubot` console script."""
    app()
