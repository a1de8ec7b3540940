"""A database built once per module and handed to each test as its own fresh copy: a page copy
of the in-memory SQLite one, or a PostgreSQL database created from the built one as template."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from storage.db import Database
from tests.support.postgres import PostgresServer


def _raw(db: Database) -> sqlite3.Connection:
    connection = db.engine.raw_connection().driver_connection
    assert isinstance(connection, sqlite3.Connection)
    return connection


class Built:
    """One database, built by the caller into `db`, then `frozen` and copied for every test.

    Nothing of the built database is ever handed out: every test writes to its own copy, so
    no test sees another's rows.
    """

    def __init__(self, db: Database, server: PostgresServer | None = None, name: str = "") -> None:
        self.db = db
        self._server = server
        self._name = name
        self._sqlite: sqlite3.Connection | None = None

    @classmethod
    @contextmanager
    def sqlite(cls) -> Iterator[Built]:
        """An empty in-memory SQLite database with every table, to build into."""
        db = Database("sqlite://")
        db.create_all()
        try:
            yield cls(db)
        finally:
            db.dispose()

    @classmethod
    @contextmanager
    def postgres(cls, server: PostgresServer) -> Iterator[Built]:
        """A new PostgreSQL database with every table, to build into; dropped at the end."""
        name = server.create_database()
        db = Database(server.url_for(name))
        db.create_all()
        try:
            yield cls(db, server, name)
        finally:
            db.dispose()
            server.drop_database(name)

    def freeze(self) -> None:
        """The build is done: PostgreSQL copies only a template nobody is connected to."""
        if self._server is None:
            self._sqlite = _raw(self.db)
        else:
            self.db.dispose()

    @contextmanager
    def copy(self) -> Iterator[Database]:
        """A fresh database holding exactly the built rows (ids and sequences included)."""
        if self._server is None:
            assert self._sqlite is not None, "freeze() the build first"
            db = Database("sqlite://")
            raw = db.engine.raw_connection()
            try:
                assert isinstance(raw.driver_connection, sqlite3.Connection)
                self._sqlite.backup(raw.driver_connection)
            finally:
                raw.close()
            try:
                yield db
            finally:
                db.dispose()
            return
        name = self._server.create_database_from(self._name)
        db = Database(self._server.url_for(name))
        try:
            yield db
        finally:
            db.dispose()
            self._server.drop_database(name)
