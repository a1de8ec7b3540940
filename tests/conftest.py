"""Fixtures every test layer may use: the suite's PostgreSQL server and a fresh `Database`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage.db import Database
from tests.support import postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[postgres.PostgresServer]:
    """The suite's PostgreSQL server (GPUBOT_TEST_POSTGRES_URL, or one started for the run)."""
    failure = ""
    try:
        with postgres.server() as server:
            yield server
    except postgres.PostgresUnavailableError as problem:
        failure = str(problem)  # failed outside the handler so the message shows once
    if failure:
        pytest.fail(failure, pytrace=False)


@pytest.fixture
def postgres_url(postgres_server: postgres.PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database (no tables), dropped after the test."""
    name = postgres_server.create_database()
    yield postgres_server.url_for(name)
    postgres_server.drop_database(name)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def database(request: pytest.FixtureRequest) -> Iterator[Database]:
    """A fresh `Database` with every table created: in-memory SQLite, then PostgreSQL."""
    if request.param == "sqlite":
        db = Database("sqlite://")
        db.create_all()
        yield db
        db.dispose()
        return
    server: postgres.PostgresServer = request.getfixturevalue("postgres_server")
    db = server.database_with_schema()
    yield db
    db.dispose()
