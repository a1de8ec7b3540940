"""`gpubot report`: GPU usage, efficiency and cost over a window from the hourly rollups, by
team, person, pool, lease or day, as a table, CSV or JSON lines; and `gpubot report observe`:
what the observe-only rules would have done. The operator's tool: it reads the database
directly and sees everything, like `gpubot leases`."""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from bot.cli.common import DatabaseUrl, fail, migrated, read_settings, resolved_url
from bot.cli.display import TimeZone, Zone, zone_option
from bot.services.observed import as_json, observed_in, render
from bot.services.rule_files import read_rules_dir
from rules.domain import format_duration
from rules.errors import PolicyError
from rules.loader import load_policy
from rules.policy import Policy
from rules.reports import (
    Counts,
    GroupBy,
    Line,
    Usage,
    Window,
    WindowError,
    biggest_first,
    day_keys,
    parse_window,
    percentile,
    total,
)
from storage import reports
from storage.reports import Filter

_SLACK_ID = re.compile(r"[UW][A-Z0-9]{2,}")

app = typer.Typer(
    help="Usage, efficiency and cost reports; `observe`: what observe-only rules would have done."
)


class Grouping(StrEnum):
    TEAM = "team"
    USER = "user"
    POOL = "pool"
    LEASE = "lease"
    DAY = "day"


class Format(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSONL = "jsonl"


class ObserveFormat(StrEnum):
    TABLE = "table"
    JSONL = "jsonl"


_BY: Mapping[Grouping, GroupBy] = {
    Grouping.TEAM: "team",
    Grouping.USER: "holder",
    Grouping.POOL: "pool",
    Grouping.LEASE: "lease",
    Grouping.DAY: "day",
}
FIELDS = (
    "key",
    "allocated_gpu_h",
    "used_gpu_h",
    "efficiency_pct",
    "idle_gpu_h",
    "unknown_gpu_h",
    "unreserved_gpu_h",
    "cost",
)
Since = Annotated[
    str,
    typer.Option(
        "--since", help="the window: 7d, 30d, 24h, 2w back from now, or a month like 2026-11"
    ),
]


@app.callback(invoke_without_command=True)
def report(  # the options are keywords: click passes them by name
    ctx: typer.Context,
    *,
    since: Since = "7d",
    group_by: Annotated[
        Grouping, typer.Option("--group-by", help="one line per team, user, pool, lease or day")
    ] = Grouping.TEAM,
    fmt: Annotated[Format, typer.Option("--format", help="table, csv or jsonl")] = Format.TABLE,
    team: Annotated[str | None, typer.Option("--team", help="only this team's use")] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="only this pool's use")] = None,
    user: Annotated[
        str | None, typer.Option("--user", help="only this person's use: Slack id or name")
    ] = None,
    tz: TimeZone = None,
    database_url: DatabaseUrl = None,
) -> None:
    """GPU-hours allocated, used and idle, efficiency and cost in a window, one line per
    group and a total; in a table also the request waits and the reclaim, extension and
    recall counts. Days and months are read in --tz (default: this machine's zone)."""
    if ctx.invoked_subcommand is not None:
        return
    zone = zone_option(tz)
    window = _window(since, zone)
    policy = _policy()
    where = Filter(holder=_person(policy, user), team=_team(policy, team), pool=_pool(policy, pool))
    by = _BY[group_by]
    prices = {n: p.cost_per_gpu_hour for n, p in policy.pools.items() if p.cost_per_gpu_hour}
    url = resolved_url(database_url)
    with migrated(url) as database, database.read() as session:
        found = reports.usage(
            session, window.since, window.until, where, by, prices=prices, tz=zone.tz
        )
        waited = reports.waits(session, window.since, window.until, where)
        waiting = reports.still_waiting(
            session, window.since, window.until, where, now=datetime.now(UTC)
        )
        counted = reports.counts(session, window.since, window.until, where)
    lines = _lines(found, by, window, zone)
    if fmt == Format.CSV:
        _write_csv(lines)
    elif fmt == Format.JSONL:
        for line in lines:
            typer.echo(json.dumps(dict(zip(FIELDS, _plain(line, none=None), strict=True))))
    else:
        priced = bool(prices) and (where.pool is None or where.pool in prices)
        _print_table(lines, by, policy, zone, window, priced=priced)
        _footer(waited, waiting, counted)


@app.command("observe")
def observe(
    since: Since = "30d",
    fmt: Annotated[
        ObserveFormat, typer.Option("--format", help="table or jsonl")
    ] = ObserveFormat.TABLE,
    tz: TimeZone = None,
    database_url: DatabaseUrl = None,
) -> None:
    """What each rule in `mode: observe` would have done in the window, and how often a lease
    was busy again soon after a would-have reclaim (reports.busy_again_within)."""
    zone = zone_option(tz)
    window = _window(since, zone)
    policy = _policy()
    url = resolved_url(database_url)
    with migrated(url) as database:
        found = observed_in(database, policy, window.since, window.until)
    if fmt == ObserveFormat.JSONL:
        for line in as_json(found):
            typer.echo(json.dumps(line))
        return
    typer.echo(render(found, tz=zone.tz))


# ---- reading the options ----------------------------------------------------------------


def _window(text: str, zone: Zone) -> Window:
    try:
        return parse_window(text, datetime.now(UTC), zone.tz)
    except WindowError as exc:
        fail(f"--since: {exc}")


def _policy() -> Policy:
    """The rules in force (GPUBOT_RULES_DIR): its teams, pools, prices and names."""
    directory = read_settings().rules_dir
    try:
        return load_policy(read_rules_dir(directory))
    except (OSError, UnicodeDecodeError, PolicyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"cannot read the rules in {directory}: {first}")


def _team(policy: Policy, name: str | None) -> str | None:
    if name is not None and name not in policy.teams:
        fail(f"--team: there is no team {name!r}; teams: {', '.join(sorted(policy.teams))}")
    return name


def _pool(policy: Policy, name: str | None) -> str | None:
    if name is not None and name not in policy.pools:
        fail(f"--pool: there is no pool {name!r}; pools: {', '.join(sorted(policy.pools))}")
    return name


def _person(policy: Policy, text: str | None) -> str | None:
    """A Slack id as given, or the id of the person org.yaml's `names` calls that."""
    if text is None:
        return None
    wanted = text.strip().removeprefix("@")
    by_name = [uid for uid, name in policy.names.items() if name.casefold() == wanted.casefold()]
    if len(by_name) == 1:
        return by_name[0]
    if not _SLACK_ID.fullmatch(wanted):
        fail(f"--user: no one is called {text!r} in org.yaml's names; give a name or Slack id")
    return wanted


# ---- the lines --------------------------------------------------------------------------


def _lines(found: dict[str, Usage], by: GroupBy, window: Window, zone: Zone) -> list[Line]:
    """Biggest first; by day every day of the window, oldest first, empty ones too."""
    if by == "day":
        return [
            Line(day, found.get(day, Usage()))
            for day in day_keys(window.since, window.until, zone.tz)
        ]
    return list(biggest_first(found))


#: The key of the use no lease held (GPUs busy without one), for programs: no name is like it.
UNRESERVED_KEY = "(unreserved)"


def _plain(line: Line, *, none: Any = "") -> list[Any]:
    """The line for programs: the raw key (Slack ids), plain numbers, `none` where there is
    no figure ("" in CSV, null in JSON)."""
    u = line.usage
    efficiency = none if u.efficiency is None else round(u.efficiency * 100, 1)
    return [
        line.key or UNRESERVED_KEY,
        round(u.allocated_h, 3),
        round(u.used_h, 3),
        efficiency,
        round(u.idle_h, 3),
        round(u.unknown_h, 3),
        round(u.unreserved_h, 3),
        round(u.cost, 2),
    ]


def _write_csv(lines: list[Line]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(FIELDS)
    for line in lines:
        writer.writerow(_plain(line))


def _key(line: Line, by: GroupBy, names: Mapping[str, str]) -> str:
    if not line.key:
        return "no lease (unreserved)"
    if by == "holder":
        name = names.get(line.key)
        return f"{name} ({line.key})" if name else line.key
    return line.key


def _print_table(
    lines: list[Line], by: GroupBy, policy: Policy, zone: Zone, window: Window, *, priced: bool
) -> None:
    shown = f"{zone.show(window.since)} to {zone.show(window.until)} ({zone.name})"
    typer.echo(f"GPU use, {window.label}: {shown}")
    if not lines or total([line.usage for line in lines]).empty:
        typer.echo("No GPU time was recorded in this window.")
        return
    table = Table(show_edge=False, pad_edge=False)
    table.add_column({"holder": "user"}.get(by, by), no_wrap=True)
    for title in ("allocated GPU-h", "used GPU-h", "efficiency", "idle GPU-h", "unknown GPU-h"):
        table.add_column(title, justify="right", no_wrap=True)
    table.add_column("unreserved GPU-h", justify="right", no_wrap=True)
    table.add_column(f"cost ({policy.reports.currency})", justify="right", no_wrap=True)
    for line in lines:
        table.add_row(_key(line, by, policy.names), *_cells(line.usage, priced))
    whole = total([line.usage for line in lines])
    table.add_section()
    table.add_row("total", *_cells(whole, priced))
    # Off a terminal rich assumes 80 columns and would fold cells; a pipe gets whole lines.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(table)


def _cells(usage: Usage, priced: bool) -> list[str]:
    efficiency = "-" if usage.efficiency is None else f"{usage.efficiency * 100:.0f} %"
    return [
        f"{usage.allocated_h:,.1f}",
        f"{usage.used_h:,.1f}",
        efficiency,
        f"{usage.idle_h:,.1f}",
        f"{usage.unknown_h:,.1f}",
        f"{usage.unreserved_h:,.1f}",
        f"{usage.cost:,.2f}" if priced else "-",
    ]


def _footer(waited: list[float], waiting: tuple[int, float | None], counted: Counts) -> None:
    if waited:
        p50, p90 = percentile(waited, 50), percentile(waited, 90)
        assert p50 is not None
        assert p90 is not None
        typer.echo(
            f"Waits from request to grant: p50 {_wait(p50)}, p90 {_wait(p90)} "
            f"(over {len(waited)} granted)"
        )
    else:
        typer.echo("Waits from request to grant: no request was granted in this window")
    count, oldest_s = waiting
    if count and oldest_s is not None:
        requests = "1 request" if count == 1 else f"{count} requests"
        typer.echo(
            f"Still waiting: {requests} filed in this window, the oldest for {_wait(oldest_s)} "
            "(not in the waits above until granted)"
        )
    typer.echo(
        f"Reclaims {counted.reclaims}, extensions {counted.extensions}, recalls {counted.recalls}"
    )


def _wait(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    return format_duration(timedelta(seconds=round(seconds / 60) * 60))
