"""A lease's marks are stored as the same JSON object as ever, and read back as `Marks`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlmodel import col, select

from rules.marks import Marks
from storage.db import Database
from storage.tables import LeaseRow, PoolRow
from tests.unit.storage.builders import a_lease

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
STORED = {
    "expiry": {"outbox": 11, "owed_at": "2026-03-02T10:00:00+00:00", "lead_min": 60.0},
    "recall": {"at": "2026-03-02T11:30:00+00:00", "request": 4, "team": "nlp", "because": "b"},
}


def a_marked_lease(database: Database, marks: Marks) -> int:
    with database.write() as session:
        session.add(PoolRow(name="a100"))
        session.flush()
        return a_lease(session, at=NOW, lasts=timedelta(0), marks=marks)


def test_marks_round_trip_through_the_same_json(database: Database) -> None:
    """What is written is the plain JSON object; what is read is `Marks` again."""
    lease_id = a_marked_lease(database, Marks.of(STORED))
    with database.read() as session:
        raw = session.connection().execute(sa.text("SELECT warnings FROM lease")).scalar_one()
        row = session.get(LeaseRow, lease_id)
        column = session.exec(select(col(LeaseRow.warnings))).one()
    stored = raw if isinstance(raw, dict) else json.loads(raw)
    assert STORED == stored
    assert row is not None
    assert Marks.of(STORED) == row.warnings == column


def test_a_change_is_written(database: Database) -> None:
    """Assigning changed marks updates the row."""
    lease_id = a_marked_lease(database, Marks())
    with database.write() as session:
        row = session.get(LeaseRow, lease_id)
        assert row is not None
        row.warnings = row.warnings.with_notice("notice:admins", at=NOW)
        session.add(row)
    with database.read() as session:
        row = session.get(LeaseRow, lease_id)
        assert row is not None
        assert {"notice:admins": {"at": NOW.isoformat()}} == row.warnings.to_json()
