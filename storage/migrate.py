"""Schema migrations run from code: `upgrade` a database to a revision, read its `current` one.

The Alembic environment lives in `storage/migrations`; no alembic.ini is needed at runtime.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from storage.db import Database

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

# Any fixed key will do: it only has to be the same for every gpubot process.
_PG_UPGRADE_LOCK = 0x67707562  # "gpub"


def alembic_config(url: str | None = None) -> Config:
    """Alembic's configuration, built in code (also for `alembic revision --autogenerate`)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # configparser treats % as interpolation; URL-encoded passwords contain it.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` up to `revision`; a database already there is left alone."""
    database = Database(url)
    try:
        with database.begin() as connection:
            if connection.dialect.name == "postgresql":
                # Two processes starting together would otherwise both run the same revisions.
                # (SQLite needs nothing: BEGIN IMMEDIATE already lets one writer in at a time.)
                connection.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_UPGRADE_LOCK}
                )
            config = alembic_config(url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        database.dispose()


def current(url: str) -> str | None:
    """The revision the database at `url` is at, or None when it was never migrated."""
    database = Database(url)
    try:
        with database.read() as session:
            return MigrationContext.configure(session.connection()).get_current_revision()
    finally:
        database.dispose()
