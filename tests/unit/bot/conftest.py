"""Fixtures for the use cases: the shipped rules on a fresh database, and a clock tests move."""

from __future__ import annotations

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


@pytest.fixture
def services(database: Database, clock: Clock) -> Iterator[Services]:
    """The use cases on the shipped rules, on SQLite and on PostgreSQL."""
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
