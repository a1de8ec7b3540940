"""How the admin command line shows people and times in its tables: the names in org.yaml's
`names` (else the Slack id), and times in one zone (--tz, else this machine's), named in the
table's header. CSV and JSON lines keep ids and UTC: they are for programs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer

from bot.cli.common import fail, read_settings
from bot.services.rule_files import read_rules_dir
from rules.errors import PolicyError
from rules.loader import load_policy

TimeZone = Annotated[
    str | None,
    typer.Option(
        "--tz",
        metavar="ZONE",
        help="time zone of the times shown, e.g. Europe/Berlin or UTC; default: this machine's",
        show_default=False,
    ),
]

LOCALTIME = Path("/etc/localtime")


@dataclass(frozen=True)
class Zone:
    """A time zone and the name the table's header gives it."""

    tz: tzinfo
    name: str

    def show(self, when: datetime | None) -> str:
        return "" if when is None else when.astimezone(self.tz).strftime("%Y-%m-%d %H:%M")


def zone_option(text: str | None) -> Zone:
    """The zone --tz names, else this machine's; a one-line failure for a name no one knows."""
    if text is None:
        return local_zone()
    try:
        return Zone(ZoneInfo(text.strip()), text.strip())
    except (ZoneInfoNotFoundError, ValueError):
        fail(f"--tz: unknown time zone {text!r}; expected a name like Europe/Berlin, UTC")


def local_zone(localtime: Path = LOCALTIME) -> Zone:
    """This machine's zone: $TZ, else what /etc/localtime links to, else its UTC offset now."""
    for name in (os.environ.get("TZ", "").removeprefix(":"), _linked_zone(localtime)):
        if name:
            try:
                return Zone(ZoneInfo(name), name)
            except (ZoneInfoNotFoundError, ValueError):
                continue
    here = datetime.now(UTC).astimezone().tzinfo or UTC
    return Zone(here, here.tzname(None) or "UTC")


def _linked_zone(localtime: Path) -> str:
    target = str(localtime.resolve()) if localtime.is_symlink() else ""
    return target.split("/zoneinfo/", 1)[1] if "/zoneinfo/" in target else ""


def people_names() -> Mapping[str, str]:
    """org.yaml's `names` of the rules in force (GPUBOT_RULES_DIR); none, with a note on
    stderr, when those rules cannot be read: the table then shows Slack ids."""
    directory = read_settings().rules_dir
    try:
        return load_policy(read_rules_dir(directory)).names
    except (OSError, UnicodeDecodeError, PolicyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        typer.echo(f"note: people shown by Slack id: {directory}: {first}", err=True)
        return {}


def name_of(user: str, names: Mapping[str, str]) -> str:
    return names.get(user, user)
