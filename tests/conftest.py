"""Fixtures every test layer may use: the suite's PostgreSQL server and a fresh `Database`; and
the skip, with its reason, of what needs durable-rules where it cannot be imported."""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import freezegun
import pytest

from storage.db import Database
from tests.imports import imports_of, modules
from tests.support import policies, postgres
from tests.support.copies import Built

# freezegun, on entering, reads every attribute of every loaded module to patch `datetime`;
# the Kubernetes client's package builds its pydantic models lazily on such a read, which
# under a half-patched `datetime` fails and leaves the clock frozen for every later test of
# the process. Its modules are left alone (they then see the real time, which they only use
# for their own HTTP calls).
# pytest's own clock (`_pytest.timing`) is left alone too: patched, it timed a test from a
# frozen instant to a real one and reported durations of decades.
freezegun.configure(extend_ignore_list=["kubernetes", "_pytest.timing"])

# The same rule files are parsed once per worker (tests/support/policies.py).
policies.parse_once()


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A command run in-process sets the root logger up on the stream pytest captured; put the
    handlers and levels back, so a later thread never writes to a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quiet = {
        name: logging.getLogger(name).level
        for name in ("apscheduler", "apscheduler.scheduler", "alembic")
    }
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, at in quiet.items():
        logging.getLogger(name).setLevel(at)


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


@pytest.fixture
def migrated_postgres_url(postgres_server: postgres.PostgresServer) -> Iterator[str]:
    """The URL of a fresh PostgreSQL database at the head of the migrations, dropped after the
    test: what a bot finds after any restart."""
    name = postgres_server.migrated_database()
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
        _copy_empty_schema(db)
        yield db
        db.dispose()
        return
    server: postgres.PostgresServer = request.getfixturevalue("postgres_server")
    db = server.database_with_schema()
    yield db
    db.dispose()


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ],
)
def database_to_build(request: pytest.FixtureRequest) -> Iterator[Built]:
    """An empty database with every table, in-memory SQLite then PostgreSQL, for a module to
    build what its tests share once and hand each test a copy (`Built.copy`)."""
    if request.param == "sqlite":
        with Built.sqlite() as built:
            yield built
        return
    server: postgres.PostgresServer = request.getfixturevalue("postgres_server")
    with Built.postgres(server) as built:
        yield built


@functools.cache
def _empty_schema() -> sqlite3.Connection:
    """An in-memory SQLite database with every table and no rows, built once per worker."""
    template = Database("sqlite://")
    template.create_all()
    # The one connection of the template's StaticPool, kept open for the worker's life.
    connection = template.engine.raw_connection().driver_connection
    assert isinstance(connection, sqlite3.Connection)
    return connection


def _copy_empty_schema(db: Database) -> None:
    """`db.create_all()` for an empty in-memory database, as a page copy of the built one
    (~1 ms instead of ~35 ms under coverage)."""
    raw = db.engine.raw_connection()
    try:
        assert isinstance(raw.driver_connection, sqlite3.Connection)
        _empty_schema().backup(raw.driver_connection)
    finally:
        raw.close()


@pytest.fixture(
    params=[
        pytest.param("sqlite-file", id="sqlite-file"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def shared_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A database many connections (threads, racing runs) share: a SQLite file, not
    :memory:, or PostgreSQL."""
    if request.param == "sqlite-file":
        db = Database(f"sqlite:///{tmp_path / 'shared.db'}")
        db.create_all()
    else:
        server: postgres.PostgresServer = request.getfixturevalue("postgres_server")
        db = server.database_with_schema()
    yield db
    db.dispose()


# durable-rules builds and imports on CPython 3.11 and 3.12 only (pyproject.toml installs it only
# there). Elsewhere the reference engine decides, and what needs durable itself is skipped:
# a test module that imports it, a test marked `durable`, and the durable case of a test
# parametrized over the engines by one of these names.
DURABLE_MODULES = frozenset({"durable", "durable_rules_engine"})
DURABLE_WRAPPER = "rules.engine.durable"
ENGINE_PARAMETERS = frozenset({"engine", "engine_name"})


@functools.cache
def durable_missing() -> str:
    """Why durable-rules cannot be imported here, or "" when it can."""
    try:
        import rules.engine.durable  # noqa: F401 - only to learn whether it imports
    except ImportError as problem:
        if problem.name in DURABLE_MODULES:
            return f"needs durable-rules, which cannot be imported here ({problem})"
    return ""


def durable_import_line(path: Path) -> int | None:
    """The line on which a test module imports durable-rules or its wrapper at import time."""
    return next(
        (
            found.line
            for found in imports_of("tests", path.read_text(encoding="utf-8"), modules())
            if found.kind == "module"
            and (found.target == DURABLE_WRAPPER or found.target.split(".")[0] in DURABLE_MODULES)
        ),
        None,
    )


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport | None:
    """A test module that imports durable-rules is skipped, with the reason, where it cannot be
    imported (instead of failing to collect)."""
    why = durable_missing()
    if not why or not isinstance(collector, pytest.Module):
        return None
    line = durable_import_line(collector.path)
    if line is None:
        return None
    return pytest.CollectReport(
        collector.nodeid, "skipped", (str(collector.path), line, f"Skipped: {why}"), []
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_without_durable(items)
    group_shared_setups(items)
    slow_first(items)


def skip_without_durable(items: list[pytest.Item]) -> None:
    """Tests marked `durable`, and durable cases of engine-parametrized tests, skip without it."""
    why = durable_missing()
    if not why:
        return
    for item in items:
        params = getattr(item, "callspec", None)
        engines = {params.params.get(name) for name in ENGINE_PARAMETERS} if params else set()
        if item.get_closest_marker("durable") or "durable" in engines:
            item.add_marker(pytest.mark.skip(reason=why))


def group_shared_setups(items: list[pytest.Item]) -> None:
    """Tests that share a module- or package-scoped fixture (a built wheel, a browser, a bot
    served for a module's examples) form one xdist group, so that under `--dist loadgroup` one
    worker runs them all and pays for that set-up once; every other test is handed out on its
    own, which keeps both workers busy to the end."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = sorted(
            {
                item.nodeid.split("::")[0] if fixture.scope == "module" else fixture.baseid
                for fixtures in info.name2fixturedefs.values()
                for fixture in fixtures
                if fixture.scope in ("module", "package")
            }
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))


def slow_first(items: list[pytest.Item]) -> None:
    """Tests marked `slow` (a minute or more each on a loaded 2-core machine) first, the rest
    in their order: xdist hands tests out in this order, and one of them handed out last kept
    one worker busy long after the other had run out of work."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
