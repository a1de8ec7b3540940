"""`gpubot db upgrade`: create the database schema or bring it up to date."""

from __future__ import annotations

import typer

from bot.cli.common import DatabaseUrl, database_errors, resolved_url, shown_url
from storage import migrate

app = typer.Typer(help="The database schema.", no_args_is_help=True)


@app.command("upgrade")
def db_upgrade(database_url: DatabaseUrl = None) -> None:
    """Create the schema or bring it up to date (safe to run again)."""
    url = resolved_url(database_url)
    with database_errors(url):
        before = migrate.current(url)
        migrate.upgrade(url)
        after = migrate.current(url)
    if before == after:
        typer.echo(f"OK: {shown_url(url)} is already at schema revision {after}")
    else:
        typer.echo(
            f"OK: {shown_url(url)} upgraded from {before or 'nothing'} to schema revision {after}"
        )
