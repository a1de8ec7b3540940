"""`gpubot leases`: the active leases (or all of them) as a table."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bot.cli.common import DatabaseUrl, migrated, resolved_url
from bot.services.reads import list_leases
from bot.services.results import LeaseView
from rules.domain import format_duration


def leases(
    show_all: Annotated[bool, typer.Option("--all", help="include ended leases")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """The active leases (or all of them), newest first."""
    url = resolved_url(database_url)
    with migrated(url) as database, database.read() as session:
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
