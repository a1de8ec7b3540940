"""The audit chain: appended rows link up, `verify` catches tampering, exports and look-ups."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from storage import audit
from storage.db import Database
from storage.tables import AuditHeadRow, AuditRow

NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
_table = AuditRow.__table__  # type: ignore[attr-defined]
_head = AuditHeadRow.__table__  # type: ignore[attr-defined]


def an_entry(n: int = 1, subject: str = "lease:1") -> audit.AuditEntry:
    return audit.AuditEntry(
        actor=f"U{n}",
        tag="lease:granted",
        subject=subject,
        outcome="approve",
        deciding_rule="within-nominal",
        matching_rules=("within-nominal", "small-request"),
        facts={"request.gpus": n, "team.used_after": 2.5, "pool": "a100"},
        detail={"gpus": [0, 1], "note": "évaluation ✓"},
        revision="3f2a9c",
        engine="durable",
    )


def append_rows(database: Database, count: int, *, step: timedelta = timedelta()) -> None:
    for n in range(1, count + 1):
        with database.write() as session:
            audit.append(session, an_entry(n), at=NOW + step * (n - 1))


def verified(database: Database) -> audit.VerifyReport:
    with database.read() as session:
        return audit.verify(session)


def tamper(database: Database, statement: sa.Executable) -> None:
    with database.write() as session:
        session.execute(statement)


def test_each_appended_row_links_to_the_one_before(database: Database) -> None:
    """Row n carries row n-1's hash; the first carries the genesis hash; the head follows."""
    append_rows(database, 3)
    with database.read() as session:
        rows = [audit.get(session, n) for n in (1, 2, 3)]
        head = session.get(AuditHeadRow, 1)
    hashes = [row.hash for row in rows if row is not None]
    assert [audit.GENESIS_HASH, *hashes[:2]] == [row.prev_hash for row in rows if row]
    assert head is not None
    assert (3, hashes[2]) == (head.last_id, head.last_hash)


def test_append_returns_the_row_it_stored(database: Database) -> None:
    """The returned row equals the one read back, datetimes and JSON included."""
    with database.write() as session:
        returned = audit.append(session, an_entry(), at=NOW)
    with database.read() as session:
        stored = audit.get(session, 1)
    assert stored is not None
    assert returned.model_dump() == stored.model_dump()


def test_append_stores_json_values_exactly_as_they_were_hashed(database: Database) -> None:
    """Tuples, sets, datetimes and int keys are stored the way they read back, so they verify."""
    entry = audit.AuditEntry(
        actor="U1",
        tag="lease:warned",
        subject="lease:1",
        facts={"seen": (1, 2), "who": {"b", "a"}, "at": NOW, 7: "int key"},  # type: ignore[dict-item]
    )
    with database.write() as session:
        audit.append(session, entry, at=NOW)
    with database.read() as session:
        stored = audit.get(session, 1)
    assert stored is not None
    expected = {"seen": [1, 2], "who": ["a", "b"], "at": NOW.isoformat(), "7": "int key"}
    assert expected == stored.facts
    assert audit.VerifyReport(ok=True, checked=1) == verified(database)


def test_append_refuses_a_naive_time(database: Database) -> None:
    """Audit times are aware UTC like every other time."""
    naive = datetime(2025, 3, 14, 9, 30)  # noqa: DTZ001  (the naive value under test)
    with pytest.raises(ValueError, match="aware"), database.write() as session:
        audit.append(session, an_entry(), at=naive)


def test_append_all_extends_the_chain_in_one_go_as_single_appends_would(
    database: Database,
) -> None:
    """A bulk import continues the chain: ids in order, each row linked, the head at the end."""
    append_rows(database, 1)
    entries = [(an_entry(n), NOW - timedelta(days=n)) for n in (2, 3, 4)]
    with database.write() as session:
        assert [2, 3, 4] == audit.append_all(session, entries)
        assert [] == audit.append_all(session, [])
    append_rows(database, 1)
    assert audit.VerifyReport(ok=True, checked=5) == verified(database)
    with database.read() as session:
        stored = audit.get(session, 3)
    assert stored is not None
    assert ("U3", NOW - timedelta(days=3)) == (stored.actor, stored.at)


def test_append_all_refuses_a_naive_time_before_writing_anything(database: Database) -> None:
    naive = datetime(2025, 3, 14, 9, 30)  # noqa: DTZ001  (the naive value under test)
    with pytest.raises(ValueError, match="aware"), database.write() as session:
        audit.append_all(session, [(an_entry(1), NOW), (an_entry(2), naive)])
    assert audit.VerifyReport(ok=True, checked=0) == verified(database)


def test_append_rolls_back_with_the_callers_transaction(database: Database) -> None:
    """A failed state change takes its audit row with it, and the chain stays whole."""

    def append_then_fail() -> None:
        with database.write() as session:
            audit.append(session, an_entry(), at=NOW)
            raise RuntimeError("the state change failed")

    with pytest.raises(RuntimeError):
        append_then_fail()
    append_rows(database, 1)
    assert audit.VerifyReport(ok=True, checked=1) == verified(database)


def test_verify_passes_on_an_empty_log(database: Database) -> None:
    """No rows and no head is a valid, empty chain."""
    assert audit.VerifyReport(ok=True, checked=0) == verified(database)


def test_verify_passes_on_an_intact_chain(database: Database) -> None:
    """Every appended row checks out."""
    append_rows(database, 5)
    assert audit.VerifyReport(ok=True, checked=5) == verified(database)


def test_hashed_columns_are_every_audit_column_but_the_hash() -> None:
    """A new audit column cannot slip past the hash unnoticed."""
    assert {c.name for c in _table.columns} - {"hash"} == set(audit.HASHED_COLUMNS)


EDITS: dict[str, Any] = {
    "id": 99,
    "at": NOW + timedelta(seconds=1),
    "actor": "mallory",
    "tag": "lease:released",
    "subject": "lease:2",
    "outcome": "deny",
    "deciding_rule": "forged-rule",
    "matching_rules": ["forged-rule"],
    "facts": {"request.gpus": 99, "team.used_after": 2.5, "pool": "a100"},
    "detail": {"gpus": [0, 1], "note": "forged"},
    "revision": "000000",
    "engine": "python",
    "prev_hash": "f" * 64,
    "hash": "e" * 64,
}


@pytest.mark.parametrize("column", list(EDITS))
def test_editing_any_column_of_a_middle_row_fails_verify_naming_it(
    database: Database, column: str
) -> None:
    """Changing one value of row 2 out of 3 is reported against row 2."""
    append_rows(database, 3)
    tamper(database, sa.update(_table).where(_table.c.id == 2).values({column: EDITS[column]}))
    report = verified(database)
    assert (False, 2) == (report.ok, report.first_bad_id)


def test_an_edit_made_with_plain_sql_fails_verify(database: Database) -> None:
    """A hand-typed UPDATE is caught and its row named in the problem."""
    append_rows(database, 3)
    tamper(database, sa.text("UPDATE audit SET actor = 'mallory' WHERE id = 2"))
    expected = audit.VerifyReport(
        ok=False, checked=1, first_bad_id=2, problem="audit row 2 was altered"
    )
    assert expected == verified(database)


def test_deleting_a_middle_row_fails_verify(database: Database) -> None:
    """The gap in ids names the missing row."""
    append_rows(database, 3)
    tamper(database, sa.delete(_table).where(_table.c.id == 2))
    expected = audit.VerifyReport(
        ok=False, checked=1, first_bad_id=2, problem="audit row 2 is missing"
    )
    assert expected == verified(database)


def test_deleting_the_last_row_fails_verify(database: Database) -> None:
    """The head still points at the deleted row."""
    append_rows(database, 3)
    tamper(database, sa.delete(_table).where(_table.c.id == 3))
    report = verified(database)
    assert (False, 2, 3) == (report.ok, report.checked, report.first_bad_id)
    assert "head points at row 3 but the last row is 2" in report.problem


def test_a_row_inserted_after_the_head_fails_verify(database: Database) -> None:
    """A forged row with a well-formed hash is still caught: the head does not know it."""
    append_rows(database, 3)
    with database.read() as session:
        head = session.get(AuditHeadRow, 1)
        assert head is not None
        last_hash = head.last_hash
    forged: dict[str, Any] = {
        **{name: EDITS[name] for name in audit.HASHED_COLUMNS},
        "id": 4,
        "prev_hash": last_hash,
    }
    forged["hash"] = audit.chain_hash(last_hash, forged)
    tamper(database, sa.insert(_table).values(forged))
    report = verified(database)
    assert (False, 4, 4) == (report.ok, report.checked, report.first_bad_id)


def test_a_head_that_does_not_match_the_last_row_fails_verify(database: Database) -> None:
    """An edited head hash is reported against the last row."""
    append_rows(database, 3)
    tamper(database, sa.update(_head).values(last_hash="a" * 64))
    expected = audit.VerifyReport(
        ok=False,
        checked=3,
        first_bad_id=3,
        problem="the audit head hash does not match row 3",
    )
    assert expected == verified(database)


def test_append_refuses_to_start_a_second_chain_when_the_head_is_gone(
    database: Database,
) -> None:
    """A deleted head is reported by verify and stops appends instead of forking the chain."""
    append_rows(database, 2)
    tamper(database, sa.delete(_head))
    assert "head row is missing" in verified(database).problem
    with pytest.raises(audit.AuditChainError), database.write() as session:
        audit.append(session, an_entry(), at=NOW)


def test_history_lists_a_subjects_rows_oldest_first(database: Database) -> None:
    """Only the subject's rows, in the order they were written."""
    for n, subject in enumerate(["lease:1", "lease:2", "lease:1"], start=1):
        with database.write() as session:
            audit.append(session, an_entry(n, subject), at=NOW)
    with database.read() as session:
        rows = audit.history(session, "lease:1")
    assert [1, 3] == [row.id for row in rows]


def test_get_returns_nothing_for_an_unknown_id(database: Database) -> None:
    """A missing id is None, not an error."""
    with database.read() as session:
        assert audit.get(session, 42) is None


def exported(
    database: Database, fmt: audit.ExportFormat, since: datetime | None = None
) -> list[str]:
    with database.read() as session:
        return list(audit.export(session, fmt, since))


def test_jsonl_export_writes_one_object_per_row(database: Database) -> None:
    """Each line is one row with every column, hash included."""
    append_rows(database, 3, step=timedelta(hours=1))
    records = [json.loads(line) for line in exported(database, "jsonl")]
    assert [1, 2, 3] == [record["id"] for record in records]
    assert list(audit.EXPORT_COLUMNS) == sorted(records[0], key=audit.EXPORT_COLUMNS.index)
    assert NOW.isoformat() == records[0]["at"]
    assert {"request.gpus": 1, "team.used_after": 2.5, "pool": "a100"} == records[0]["facts"]


def test_csv_export_starts_with_a_header(database: Database) -> None:
    """A header row, then one row per audit row with JSON columns as JSON text."""
    append_rows(database, 3, step=timedelta(hours=1))
    lines = exported(database, "csv")
    assert ",".join(audit.EXPORT_COLUMNS) + "\n" == lines[0]
    records = list(csv.DictReader(lines))
    assert ["1", "2", "3"] == [record["id"] for record in records]
    assert ["within-nominal", "small-request"] == json.loads(records[0]["matching_rules"])
    assert "évaluation ✓" == json.loads(records[0]["detail"])["note"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_since_keeps_rows_at_or_after_it(
    database: Database, fmt: audit.ExportFormat
) -> None:
    """Rows older than `since` are left out; the one exactly at `since` stays."""
    append_rows(database, 3, step=timedelta(hours=1))
    lines = exported(database, fmt, since=NOW + timedelta(hours=1))
    if fmt == "csv":
        ids = [int(record["id"]) for record in csv.DictReader(lines)]
    else:
        ids = [json.loads(line)["id"] for line in lines]
    assert [2, 3] == ids


def test_export_refuses_an_unknown_format(database: Database) -> None:
    """Only csv and jsonl are offered."""
    with pytest.raises(ValueError, match="xml"):
        exported(database, "xml")  # type: ignore[arg-type]
