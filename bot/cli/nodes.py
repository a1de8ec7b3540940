"""`gpubot nodes`: every node and GPU, where it stands and its profile, or its history."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bot.cli.common import DatabaseUrl, fail, migrated, resolved_url, since_option
from bot.cli.display import TimeZone, Zone, name_of, people_names, zone_option
from bot.services import device_records, strangers


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


def nodes(
    *,
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
    tz: TimeZone = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Every node and GPU: where it stands, whether it reports, its profile; or its history.
    The history's table names people as org.yaml does and shows times in --tz (default: this
    machine's zone); csv and jsonl keep Slack ids and UTC."""
    if since is not None and not show_history:
        fail("--since goes with --history: the current state has no time range")
    start = since_option(since)
    zone = zone_option(tz) if show_history and fmt == NodesFormat.TABLE else None
    url = resolved_url(database_url)
    with migrated(url) as database, database.read() as session:
        if node is not None and not device_records.profiles(session, node):
            stray = strangers.strays(session).get(node)
            if stray is not None and not show_history:
                fail(
                    f"{node} is in no pool of pools.yaml, but it reported {stray} GPUs; "
                    f"`gpubot nodes --history --node {node}` shows when"
                )
            if stray is None:
                fail(f"there is no node {node!r} in the database")
        if show_history:
            found = device_records.intervals(session, start)
            found = [i for i in found if node is None or i.node == node]
            rows = [_interval_row(i) for i in found]
            if zone is not None:
                names = people_names()
                rows = [
                    _interval_shown(row, i, zone, names) for row, i in zip(rows, found, strict=True)
                ]
            fields = _INTERVAL_FIELDS
        else:
            rows = [_gpu_row(n, g) for n in device_records.profiles(session, node) for g in n.gpus]
            fields = _GPU_FIELDS if fmt != NodesFormat.TABLE else _TABLE_FIELDS
    _emit(rows, fields, fmt, zone)


# Words for the command line: one per state, the same as the history's.
_STATE_WORDS = {"silent": "not-reporting"}


def _gpu_row(node: device_records.NodeProfile, gpu: device_records.GpuProfile) -> dict[str, object]:
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


def _interval_row(interval: device_records.Interval) -> dict[str, object]:
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


def _interval_shown(
    row: dict[str, object], interval: device_records.Interval, zone: Zone, names: Mapping[str, str]
) -> dict[str, object]:
    """The row for people to read: who by name, and times in `zone` (named in the header)."""
    shown = {"start": zone.show(interval.start), "end": zone.show(interval.end)}
    return {**row, **shown, "by": name_of(interval.by, names)}


def _iso(when: datetime | None) -> str:
    return "" if when is None else when.astimezone(UTC).isoformat(timespec="seconds")


def _emit(
    rows: list[dict[str, object]],
    fields: tuple[str, ...],
    fmt: NodesFormat,
    zone: Zone | None = None,
) -> None:
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
        title = name.replace("_", " ")
        if zone is not None and name in ("start", "end"):
            title = f"{name} ({zone.name})"
        table.add_column(title, no_wrap=name in ("node", "gpu", "state"))
    for row in rows:
        table.add_row(*("" if row[f] is None else str(row[f]) for f in fields))
    console = Console() if sys.stdout.isatty() else Console(width=240)
    console.print(table)
