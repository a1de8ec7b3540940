"""Alembic's environment: runs the revisions on the connection `storage.migrate` hands over.

Used without alembic.ini: `storage.migrate.alembic_config` builds the configuration in code.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import storage.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from storage.db import Database

config = context.config
target_metadata = SQLModel.metadata


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Emit the SQL instead of running it (`alembic upgrade --sql`)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    database = Database(config.get_main_option("sqlalchemy.url") or "")
    try:
        with database.begin() as fresh:
            _configure_and_run(fresh)
    finally:
        database.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
