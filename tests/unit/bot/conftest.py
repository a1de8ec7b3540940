"""Fixtures for the use cases: the shipped rules on a fresh database, and a clock tests move."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from bot.services import BorrowAsk, Services
from bot.services.results import BorrowResult, SettleResult
from storage.db import Database
from tests.builders import default_sources

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday morning

ALICE, BOB = "U0ALICE01", "U0BOB0001"  # vision members
CAROL = "U0CAROL01"  # nlp member
ERIN = "U0ERIN001"  # platform member
VICTOR = "U0VMGR001"  # vision manager
NADIA = "U0NMGR001"  # nlp manager
ADA = "U0ADMIN01"  # admin


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta) -> None:
        self.now += by


@pytest.fixture
def clock() -> Clock:
    return Clock()


@functools.cache
def _opened(at: datetime) -> sqlite3.Connection:
    """An in-memory database as the shipped rules open it at `at` (the inventory in step with
    them), built once per worker and moment."""
    template = Database("sqlite://")
    template.create_all()
    Services.open(template, default_sources(), clock=lambda: at).close()
    # The one connection of the template's StaticPool, kept open for the worker's life.
    connection = template.engine.raw_connection().driver_connection
    assert isinstance(connection, sqlite3.Connection)
    return connection


def _open_from_copy(database: Database, at: datetime) -> None:
    """On an in-memory database nothing was written to yet, what opening the shipped rules at
    `at` writes, as a page copy of a database they opened (opening them again then finds the
    inventory in step and writes nothing)."""
    url = database.url
    if url.get_backend_name() != "sqlite" or url.database not in (None, "", ":memory:"):
        return
    raw = database.engine.raw_connection()
    try:
        connection = raw.driver_connection
        assert isinstance(connection, sqlite3.Connection)
        if connection.total_changes == 0:
            _opened(at).backup(connection)
    finally:
        raw.close()


@pytest.fixture
def services(database: Database, clock: Clock) -> Iterator[Services]:
    """The use cases on the shipped rules, on SQLite and on PostgreSQL."""
    _open_from_copy(database, clock.now)
    svc = Services.open(database, default_sources(), clock=clock)
    yield svc
    svc.close()


def borrowed(services: Services, user: str, ask: BorrowAsk) -> BorrowResult:
    """The borrow's result, which must not be a refusal."""
    result = services.borrow(user, ask)
    assert isinstance(result, BorrowResult), result
    return result


def approved(services: Services, manager: str, result: BorrowResult) -> SettleResult:
    """The manager approves the borrow, which must settle."""
    settled = services.approve(manager, result.request.id)
    assert isinstance(settled, SettleResult), settled
    return settled
