"""What every `gpubot` command shares: exit codes, the one-line failure, settings, the
--database-url option and the database checks, the --since option.

Exit status: 0 done, 1 the audit chain is broken, 2 the command could not do its job (bad input,
rule problems, an unreachable database). Expected failures print one line, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, NoReturn

import sqlalchemy as sa
import typer
from alembic.util.exc import CommandError
from pydantic import ValidationError

from bot.settings import Settings
from rules.expr import parse_duration
from storage import migrate
from storage.db import Database

EXIT_BROKEN = 1
EXIT_FAILED = 2

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="SQLAlchemy URL; default: GPUBOT_DATABASE_URL or sqlite:///gpubot.db",
        show_default=False,
    ),
]


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def read_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(f"{_env_name(e['loc'])}: {e['msg']}" for e in exc.errors())
        fail(f"invalid settings: {problems}")


def _env_name(loc: tuple[int | str, ...]) -> str:
    """The environment variable a settings error is about (GPUBOT_RULES_ENGINE, SLACK_...)."""
    name = str(loc[0]) if loc else "settings"
    field = Settings.model_fields.get(name)
    return name if field is None or field.alias else f"GPUBOT_{name.upper()}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def shown_url(url: str) -> str:
    """The URL without its password, fit for a terminal."""
    return sa.make_url(url).render_as_string(hide_password=True)


@contextmanager
def database_errors(url: str) -> Iterator[None]:
    """Turn the ways a database can be out of reach into one line and exit 2."""
    try:
        shown = shown_url(url)
    except sa.exc.ArgumentError:
        fail("bad database URL: expected e.g. sqlite:///gpubot.db or postgresql://user@host/db")
    try:
        yield
    except sa.exc.ArgumentError as exc:  # e.g. a dialect SQLAlchemy does not know
        fail(f"bad database URL {shown}: {exc}")
    except ImportError as exc:
        fail(f"no driver for {shown}: {exc} (PostgreSQL: pip install 'gpubot[postgres]')")
    except sa.exc.DBAPIError as exc:
        lines = str(exc.orig).strip().splitlines() or [type(exc.orig).__name__]
        fail(f"cannot use the database at {shown}: {lines[0]}")
    except CommandError as exc:  # alembic: e.g. a revision this version does not know
        fail(f"cannot migrate the database at {shown}: {exc}")


def resolved_url(option: str | None) -> str:
    return option if option is not None else read_settings().database_url


@contextmanager
def migrated(url: str) -> Iterator[Database]:
    """The database at `url`, refused unless `gpubot db upgrade` has created its schema."""
    with database_errors(url):
        missing = _missing_sqlite_file(url)
        if missing:  # connecting would create an empty file
            fail(f"no database file at {missing}; run `gpubot db upgrade` first")
        if migrate.current(url) is None:
            fail(f"the database at {shown_url(url)} has no gpubot schema; run `gpubot db upgrade`")
        database = Database(url)
        try:
            yield database
        finally:
            database.dispose()


def _missing_sqlite_file(url: str) -> str | None:
    parsed = sa.make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or path in (None, "", ":memory:"):
        return None
    if parsed.query.get("mode") == "memory" or Path(path).exists():
        return None
    return path


def parse_since(text: str, now: datetime) -> datetime:
    """An ISO date or time (naive means UTC), or a duration back from `now` like 2d or 6h."""
    minutes = parse_duration(text)
    if minutes is not None:
        return now - timedelta(minutes=minutes)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since: expected an ISO date or time (2024-05-01, 2024-05-01T12:00, naive "
            f"means UTC) or a duration back from now (90m, 6h, 2d), got {text!r}"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def since_option(text: str | None) -> datetime | None:
    """A --since option read now, or a one-line failure that says what it expected."""
    if text is None:
        return None
    try:
        return parse_since(text, datetime.now(UTC))
    except ValueError as exc:
        fail(str(exc))
