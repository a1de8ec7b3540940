"""`gpubot leases`: the active leases (or all of them) as a table, with people's names and
times in one zone."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bot.cli.common import DatabaseUrl, migrated, resolved_url
from bot.cli.display import TimeZone, Zone, name_of, people_names, zone_option
from bot.services.reads import list_leases
from bot.services.results import LeaseView
from rules.domain import format_duration


def leases(
    show_all: Annotated[bool, typer.Option("--all", help="include ended leases")] = False,
    tz: TimeZone = None,
    database_url: DatabaseUrl = None,
) -> None:
    """The active leases (or all of them), newest first: holders by their names in org.yaml,
    times in --tz or this machine's zone."""
    zone = zone_option(tz)
    url = resolved_url(database_url)
    with migrated(url) as database, database.read() as session:
        views = list_leases(session, active_only=not show_all)
    if not views:
        typer.echo("No leases." if show_all else "No active leases.")
        return
    table = lease_table(views, datetime.now(UTC), zone, people_names())
    # Off a terminal rich assumes 80 columns and would fold cells; a pipe gets whole lines.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(table)


def lease_table(
    views: Iterable[LeaseView], now: datetime, zone: Zone, names: Mapping[str, str]
) -> Table:
    table = Table(title=None, show_edge=False, pad_edge=False)
    columns = ("lease", "holder", "team", "pool", "GPUs", "granted", "expires")
    for name in columns:
        title = f"{name} ({zone.name})" if name in ("granted", "expires") else name
        table.add_column(title, no_wrap=True)
    table.add_column("time left", no_wrap=True, justify="right")
    table.add_column("state", no_wrap=True)
    for view in views:
        table.add_row(
            view.code,
            name_of(view.holder, names),
            view.team,
            view.pool,
            " ".join(f"{node}:{','.join(map(str, idx))}" for node, idx in view.by_node.items()),
            zone.show(view.granted_at),
            zone.show(view.expires_at),
            _time_left(view, now),
            view.state,
        )
    return table


def _time_left(view: LeaseView, now: datetime) -> str:
    if view.state != "active":
        return "-"
    left = view.expires_at - now
    return format_duration(left) if left > timedelta(0) else f"overdue {format_duration(-left)}"
