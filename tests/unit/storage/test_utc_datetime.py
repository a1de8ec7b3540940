"""Timestamps are aware UTC on the way in and on the way out, on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from storage.db import Database
from storage.tables import SettingRow


def test_a_naive_datetime_is_refused(database: Database) -> None:
    """Writing a datetime without a time zone fails instead of guessing one."""
    naive = datetime(2025, 3, 14, 9, 30)  # noqa: DTZ001  (the naive value under test)
    with pytest.raises(sa.exc.StatementError, match="naive datetime"), database.write() as s:
        s.add(SettingRow(key="automation", value="paused", updated_at=naive, updated_by="U1"))


def test_a_datetime_comes_back_aware_in_utc(database: Database) -> None:
    """A time written with any offset reads back as the same instant in UTC."""
    paris = timezone(timedelta(hours=2))
    written = datetime(2025, 3, 14, 11, 30, 15, 123456, tzinfo=paris)
    with database.write() as session:
        session.add(SettingRow(key="k", value="v", updated_at=written, updated_by="U1"))
    with database.read() as session:
        row = session.get(SettingRow, "k")
        assert row is not None
        read = row.updated_at
    assert (datetime(2025, 3, 14, 9, 30, 15, 123456, tzinfo=UTC), UTC) == (read, read.tzinfo)
