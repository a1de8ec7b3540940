"""The audit log read as stored text: rows are stored as the canonical JSON their hash covers;
verify and export stream them, range by range and in worker processes, and say exactly what
decoding every row through the ORM says (`walked` and `exported_by_decoding` below)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import tracemalloc
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from storage import audit, audit_reads, audit_text, audit_workers, migrate
from storage.db import Database
from storage.tables import AuditHeadRow, AuditRow
from tests.bench.audit_scale import insert_chain, measure
from tests.unit.bot.cli.builders import gpubot

NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
_table = AuditRow.__table__  # type: ignore[attr-defined]
_head = AuditHeadRow.__table__  # type: ignore[attr-defined]
JSON_COLUMNS = ("matching_rules", "facts", "detail")
ROWS, CHUNK = 24, 8  # three ranges of ids: (0, 8], (8, 16], (16, 24]


def an_entry(n: int) -> audit.AuditEntry:
    return audit.AuditEntry(
        actor=f"U{n}",
        tag="lease:granted",
        subject=f"lease:{n}",
        outcome="approve",
        # every other row has a string JSON escapes: read as text, not as bytes
        deciding_rule="within-nominal" if n % 2 else 'the "quoted"\trule',
        matching_rules=("within-nominal", "small-request"),
        facts={"request.gpus": n, "team.used_after": 2.5, "z": {"b": [1, 2], "a": None}},
        detail={"note": 'évaluation ✓ "quoted"\n', 7: "int key", "gpus": (0, 1)},  # type: ignore[dict-item]
        revision="3f2a9c",
        engine="durable",
    )


def append_rows(database: Database, first: int, count: int) -> None:
    """Rows `first` .. `first + count - 1`, a second apart (some with a fraction of one)."""
    entries = [
        (an_entry(n), NOW + timedelta(seconds=n, microseconds=(n % 3) * 250_000))
        for n in range(first, first + count)
    ]
    with database.write() as session:
        audit.append_all(session, entries)


def append_old_rows(database: Database, count: int) -> None:
    """Rows as they were stored before: JSON columns in json.dumps's default spelling (spaces,
    ASCII escapes, keys unsorted), hashed over their canonical form all the same."""
    with database.read() as session:
        last_id, last_hash = 0, audit.GENESIS_HASH
        head = session.get(AuditHeadRow, 1)
        if head is not None:
            last_id, last_hash = head.last_id, head.last_hash
    with database.write() as session:
        for n in range(last_id + 1, last_id + count + 1):
            entry = an_entry(n)
            values: dict[str, Any] = {
                "id": n,
                "at": NOW + timedelta(seconds=n, microseconds=n % 2),
                **{name: getattr(entry, name) for name in ("actor", "subject", "outcome")},
                "tag": str(entry.tag),
                "deciding_rule": entry.deciding_rule,
                "matching_rules": list(entry.matching_rules),
                "facts": audit_text.plain(entry.facts),
                "detail": audit_text.plain(entry.detail),
                "revision": entry.revision,
                "engine": entry.engine,
                "prev_hash": last_hash,
            }
            values["hash"] = audit.chain_hash(last_hash, values)
            session.execute(sa.insert(_table).values(values))  # the ORM's JSON: json.dumps
            last_id, last_hash = n, values["hash"]
        session.execute(
            sa.update(_head).values(last_id=last_id, last_hash=last_hash)
            if head is not None
            else sa.insert(_head).values(id=1, last_id=last_id, last_hash=last_hash)
        )


def walked(database: Database) -> audit.VerifyReport:
    """The verify every row once had: each decoded through the ORM, walked in id order."""
    with database.read() as session:
        checked, last_id, last_hash = 0, 0, audit.GENESIS_HASH
        for row in session.execute(sa.select(_table).order_by(_table.c.id)).mappings():
            if row["id"] != last_id + 1:
                return broken(checked, last_id + 1, f"audit row {last_id + 1} is missing")
            if row["prev_hash"] != last_hash:
                problem = f"audit row {row['id']} does not follow row {last_id}"
                return broken(checked, row["id"], problem)
            if audit.chain_hash(last_hash, row) != row["hash"]:
                return broken(checked, row["id"], f"audit row {row['id']} was altered")
            checked, last_id, last_hash = checked + 1, row["id"], row["hash"]
        head = session.execute(sa.select(_head)).first()
    if head is None:
        if checked:
            return broken(checked, last_id, "the audit head row is missing")
        return audit.VerifyReport(ok=True, checked=0)
    if head.last_id != last_id:
        problem = f"the audit head points at row {head.last_id} but the last row is {last_id}"
        return broken(checked, min(head.last_id, last_id) + 1, problem)
    if head.last_hash != last_hash:
        return broken(checked, last_id, f"the audit head hash does not match row {last_id}")
    return audit.VerifyReport(ok=True, checked=checked)


def broken(checked: int, bad_id: int, problem: str) -> audit.VerifyReport:
    return audit.VerifyReport(ok=False, checked=checked, first_bad_id=bad_id, problem=problem)


def exported_by_decoding(
    database: Database, fmt: audit.ExportFormat, since: datetime | None = None
) -> list[str]:
    """The export every row once had: each decoded through the ORM and encoded again."""
    query = sa.select(_table).order_by(_table.c.id)
    if since is not None:
        query = query.where(_table.c.at >= since)
    with database.read() as session:
        rows = list(session.execute(query).mappings())
    records = [
        {name: row[name] for name in audit.EXPORT_COLUMNS} | {"at": row["at"].isoformat()}
        for row in rows
    ]
    if fmt == "jsonl":
        return [audit.canonical_json(record) + "\n" for record in records]
    lines = [",".join(audit.EXPORT_COLUMNS) + "\n"]
    for record in records:
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerow(
            [
                audit.canonical_json(value) if name in JSON_COLUMNS else value
                for name, value in record.items()
            ]
        )
        lines.append(out.getvalue())
    return lines


def verified(database: Database, workers: int) -> audit.VerifyReport:
    with database.read() as session:
        return audit.verify(session, workers=workers, chunk_rows=CHUNK)


def stored_json(database: Database, row_id: int) -> list[str]:
    cast = "::text" if database.dialect == "postgresql" else ""
    columns = ", ".join(f"{name}{cast}" for name in ("matching_rules", "facts", "detail"))
    with database.read() as session:
        row = session.execute(sa.text(f"SELECT {columns} FROM audit WHERE id = {row_id}")).one()  # noqa: S608
    return list(row)


def tamper(database: Database, statement: sa.Executable) -> None:
    with database.write() as session:
        session.execute(statement)


# ---- stored as hashed ------------------------------------------------------------------------


def test_rows_are_stored_as_the_canonical_json_their_hash_covers(database: Database) -> None:
    """The JSON columns hold canonical text (sorted keys, no spaces, UTF-8), and each row's
    body is its stored text put together, nothing decoded."""
    append_rows(database, 1, 3)
    entry = an_entry(2)
    expected = [
        audit.canonical_json(audit_text.plain(value))
        for value in (list(entry.matching_rules), entry.facts, entry.detail)
    ]
    assert expected == stored_json(database, 2)
    with database.read() as session:
        raw = session.connection().connection.driver_connection
        rows = list(audit_reads.rows(raw, database.dialect, 0, 3))
    # row 2's deciding rule has a quote JSON escapes: it is decoded to be checked
    assert [True, False, True] == [audit_text.is_stored_hash(row) for row in rows]
    assert [True, True, True] == [audit_text.holds(row) for row in rows]


def test_a_row_read_through_the_orm_still_holds_its_values(database: Database) -> None:
    """Canonical text is ordinary JSON to every other reader."""
    append_rows(database, 1, 1)
    with database.read() as session:
        row = audit.get(session, 1)
    assert row is not None
    assert {"7": "int key", "gpus": [0, 1], "note": 'évaluation ✓ "quoted"\n'} == row.detail


# ---- verify ----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_chain_of_new_and_old_rows_verifies(shared_db: Database, workers: int) -> None:
    """Rows stored before (decoded to be checked) and after (checked as stored) in one chain,
    across ranges of ids, in this process or in two workers."""
    append_old_rows(shared_db, 10)
    append_rows(shared_db, 11, 10)
    append_old_rows(shared_db, 4)
    assert ["[", "{", "{"] == [text[0] for text in stored_json(shared_db, 3)]
    assert '{"request.gpus": 3' in stored_json(shared_db, 3)[1]  # the old spelling
    expected = audit.VerifyReport(ok=True, checked=ROWS)
    assert expected == walked(shared_db)
    assert expected == verified(shared_db, workers)


def test_rows_appended_while_workers_read_do_not_look_like_tampering(
    shared_db: Database,
) -> None:
    """Rows appended after the verify's snapshot was taken: the workers, reading later on
    connections of their own, read only up to the ids and head that snapshot holds (SQLite),
    or inside that very snapshot (PostgreSQL, REPEATABLE READ)."""
    append_rows(shared_db, 1, ROWS)
    with shared_db.read() as session:
        if shared_db.dialect == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        session.execute(sa.select(_head.c.last_id)).one()  # the snapshot starts here
        append_rows(shared_db, ROWS + 1, 6)  # committed by another connection
        report = audit.verify(session, workers=2, chunk_rows=CHUNK)
    assert audit.VerifyReport(ok=True, checked=ROWS) == report
    assert audit.VerifyReport(ok=True, checked=ROWS + 6) == verified(shared_db, 2)


def test_verify_passes_on_an_empty_log_in_workers(shared_db: Database) -> None:
    assert audit.VerifyReport(ok=True, checked=0) == verified(shared_db, 2)


def edit(column: str, value: object, row_id: int) -> sa.Executable:
    return sa.update(_table).where(_table.c.id == row_id).values({column: value})


def delete(*row_ids: int) -> sa.Executable:
    return sa.delete(_table).where(_table.c.id.in_(row_ids))


def hash_of(row_id: int) -> sa.ScalarSelect[Any]:
    return sa.select(_table.c.hash).where(_table.c.id == row_id).scalar_subquery()


TAMPERING: dict[str, sa.Executable] = {
    # in the middle of a range
    "actor of row 5": edit("actor", "mallory", 5),
    "time of row 5": edit("at", NOW, 5),
    "facts of row 5": edit("facts", {"request.gpus": 99}, 5),
    "detail of row 5, same value, other spelling": sa.text(
        'UPDATE audit SET detail = \'{"note": "x"}\' WHERE id = 5'
    ),
    "matching rules of row 5": edit("matching_rules", ["forged"], 5),
    "hash of row 5": edit("hash", "e" * 64, 5),
    "id of row 5": edit("id", 99, 5),
    # at the boundaries of a range
    "outcome of row 8, the last of its range": edit("outcome", "deny", 8),
    "engine of row 9, the first of its range": edit("engine", "python", 9),
    "row 9 deleted": delete(9),
    "row 8 deleted": delete(8),
    "rows 8 to 17 deleted": delete(*range(8, 18)),
    "the first row deleted": delete(1),
    "the last row deleted": delete(ROWS),
    "row 9 follows row 7": edit("prev_hash", hash_of(7), 9),
    "row 12 follows row 10": edit("prev_hash", hash_of(10), 12),
    "row 1 follows a forged row": edit("prev_hash", "f" * 64, 1),
    # the head
    "the head's hash": sa.update(_head).values(last_hash="a" * 64),
    "the head one row short": sa.update(_head).values(last_id=ROWS - 1),
    "the head gone": sa.delete(_head),
}


#: The cases checked by worker processes too (each starts two Python processes).
IN_WORKERS = ("facts of row 5", "row 8 deleted", "row 9 follows row 7", "the head's hash")


@pytest.mark.parametrize(
    ("case", "workers"),
    [(case, 1) for case in TAMPERING] + [(case, 2) for case in IN_WORKERS],
    ids=[f"{case}-one-process" for case in TAMPERING]
    + [f"{case}-two-workers" for case in IN_WORKERS],
)
def test_tampering_is_reported_as_walking_every_row_reports_it(
    shared_db: Database, case: str, workers: int
) -> None:
    """The same first bad id, message and count of intact rows as the row-by-row walk, inside
    a range and at its edges, ranges checked in this process or in workers."""
    append_old_rows(shared_db, 2)
    append_rows(shared_db, 3, ROWS - 2)
    tamper(shared_db, TAMPERING[case])
    expected = walked(shared_db)
    assert not expected.ok
    assert expected == verified(shared_db, workers)


def test_a_row_edited_in_the_middle_of_a_range_is_named_with_todays_message(
    shared_db: Database,
) -> None:
    """Row 5's actor edited: row 5 was altered, the 4 before it intact."""
    append_rows(shared_db, 1, ROWS)
    tamper(shared_db, edit("actor", "mallory", 5))
    assert broken(4, 5, "audit row 5 was altered") == verified(shared_db, 2)


def test_a_forged_row_past_the_head_in_a_range_of_its_own_is_caught(
    shared_db: Database,
) -> None:
    """A well-formed row 25 the head does not know, alone in the fourth range."""
    append_rows(shared_db, 1, ROWS)
    with shared_db.read() as session:
        head = session.get(AuditHeadRow, 1)
        assert head is not None
        last_hash = head.last_hash
    forged: dict[str, Any] = {
        "id": ROWS + 1,
        "at": NOW,
        **dict.fromkeys(("actor", "tag", "subject", "outcome", "deciding_rule"), "x"),
        **dict.fromkeys(("revision", "engine"), "x"),
        "matching_rules": [],
        "facts": {},
        "detail": {},
        "prev_hash": last_hash,
    }
    forged["hash"] = audit.chain_hash(last_hash, forged)
    tamper(shared_db, sa.insert(_table).values(forged))
    expected = broken(
        ROWS + 1, ROWS + 1, f"the audit head points at row {ROWS} but the last row is {ROWS + 1}"
    )
    assert expected == walked(shared_db)
    assert expected == verified(shared_db, 2)


SHIFTS = {
    # detail, engine, facts: the detail ends early, the facts take the rest
    "detail into facts": (
        audit.AuditEntry(
            actor="U1",
            tag="t:x",
            subject="s",
            detail={"a": 1, "engine": "x", "facts": {"b": 2}},
            facts={"c": 3},
            engine="e",
        ),
        {"detail": '{"a":1', "engine": "x", "facts": '{"b":2}},"engine":"e","facts":{"c":3}'},
    ),
    # facts, id, matching rules: the facts end early, the matching rules take the rest
    "facts into matching rules": (
        audit.AuditEntry(
            actor="U1",
            tag="t:x",
            subject="s",
            facts={"a": 1, "id": 1, "matching_rules": []},
            matching_rules=("r",),
        ),
        {"facts": '{"a":1', "matching_rules": '[]},"id":1,"matching_rules":["r"]'},
    ),
}


ESCAPED_TEXT = {
    "a newline": "U1\nU2",
    "a control character": "U1\x01",
    "a quote": 'U1 "the first"',
    "a backslash": "C:\\U1",
    "a tab and a quote": 'a\t"b"',
}


@pytest.mark.parametrize("text", list(ESCAPED_TEXT))
def test_a_text_column_json_escapes_verifies_and_exports_decoded(
    database: Database, text: str
) -> None:
    """A text column whose JSON escapes its characters is not its body as stored: the row is
    decoded to be judged and exported, and it holds."""
    with database.write() as session:
        audit.append(
            session, audit.AuditEntry(actor=ESCAPED_TEXT[text], tag="t:x", subject="s"), at=NOW
        )
    with database.read() as session:
        raw = session.connection().connection.driver_connection
        (row,) = audit_reads.rows(raw, database.dialect, 0, 1)
    assert not audit_text.is_stored_hash(row)
    assert audit_text.holds(row)
    assert audit.VerifyReport(ok=True, checked=1) == verified(database, 1)
    with database.read() as session:
        assert exported_by_decoding(database, "jsonl") == list(audit.export(session, "jsonl"))


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ('U1 "the first"', 'U1 \\"the first\\"'),  # the quotes' escapes written in
        ("U1\nU2", "U1\\nU2"),  # the newline's escape written in
        ("U1", "U1\n"),  # a raw newline the body cannot hold
    ],
    ids=["escaped quotes", "escaped newline", "raw newline"],
)
def test_a_text_column_edited_to_spell_its_json_escape_is_caught(
    database: Database, before: str, after: str
) -> None:
    """Text put together between quotes as stored would read the same as what was hashed if
    a stored escape were taken for the character it escapes: such a row is decoded, and fails."""
    with database.write() as session:
        audit.append(session, audit.AuditEntry(actor=before, tag="t:x", subject="s"), at=NOW)
    tamper(database, edit("actor", after, 1))
    assert broken(0, 1, "audit row 1 was altered") == verified(database, 1)
    assert broken(0, 1, "audit row 1 was altered") == walked(database)


@pytest.mark.parametrize("shift", list(SHIFTS))
def test_json_text_shifted_from_one_column_into_the_next_is_caught(
    database: Database, shift: str
) -> None:
    """Text moved from one JSON column into the next adds up to the same body, and so to the
    same hash; the row still fails (SQLite stores any text; PostgreSQL refuses it)."""
    entry, shifted = SHIFTS[shift]
    with database.write() as session:
        audit.append(session, entry, at=NOW)
    assert audit.VerifyReport(ok=True, checked=1) == verified(database, 1)
    assert adds_up_to_its_hash(database)
    cast = "CAST(:{} AS json)" if database.dialect == "postgresql" else ":{}"
    assignments = ", ".join(
        f"{name} = {cast.format(name) if name in JSON_COLUMNS else ':' + name}" for name in shifted
    )
    update = sa.text(f"UPDATE audit SET {assignments} WHERE id = 1").bindparams(**shifted)  # noqa: S608
    if database.dialect == "postgresql":
        with pytest.raises(sa.exc.DataError):  # the json type refuses it on the way in
            tamper(database, update)
        return
    tamper(database, update)
    assert adds_up_to_its_hash(database)  # the stored text put together: the same body
    assert broken(0, 1, "audit row 1 was altered") == verified(database, 1)
    assert broken(0, 1, "audit row 1 was altered") == walked_or_refused(database)


def adds_up_to_its_hash(database: Database) -> bool:
    """Whether row 1's stored text, put together as it is, hashes to its stored hash."""
    plain = [column for column in _table.columns if column.name not in JSON_COLUMNS]
    with database.read() as session:
        row = session.execute(sa.select(*plain).where(_table.c.id == 1)).mappings().one()
    json_text = dict(zip(JSON_COLUMNS, stored_json(database, 1), strict=True))
    values = [
        json_text[name] if name in JSON_COLUMNS else audit.canonical_json(row[name])
        for name in audit.HASHED_COLUMNS
    ]
    values[1] = audit.canonical_json(row["at"].isoformat())
    head, tail = audit_text.body_parts(values)
    return bool(audit_text.digest(row["prev_hash"], head + tail) == row["hash"])


def walked_or_refused(database: Database) -> audit.VerifyReport:
    """The row-by-row walk, which cannot even decode such a row."""
    try:
        return walked(database)
    except json.JSONDecodeError:
        return broken(0, 1, "audit row 1 was altered")


# ---- export ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_writes_what_decoding_every_row_writes(
    database: Database, fmt: audit.ExportFormat
) -> None:
    """New rows (their text as stored) and old ones (decoded, encoded again) export as before,
    all of them and since a time."""
    append_old_rows(database, 3)
    append_rows(database, 4, 5)
    append_old_rows(database, 2)
    for since in (None, NOW + timedelta(seconds=5), NOW + timedelta(seconds=4, microseconds=1)):
        with database.read() as session:
            lines = list(audit.export(session, fmt, since))
        assert exported_by_decoding(database, fmt, since) == lines
    with database.read() as session:
        assert 10 == len(list(audit.export(session, "jsonl")))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_in_workers_writes_the_same_blocks_in_order(
    shared_db: Database, fmt: audit.ExportFormat
) -> None:
    """Ranges of 8 rows written by two worker processes, old rows and new, all of them and
    since a time: the same text as one process writes, each block with its count of rows."""
    append_old_rows(shared_db, 5)
    append_rows(shared_db, 6, ROWS - 5)
    for since in (None, NOW + timedelta(seconds=11)):
        with shared_db.read() as session:
            blocks = list(audit.export_blocks(session, fmt, since, workers=2, chunk_rows=CHUNK))
        expected = exported_by_decoding(shared_db, fmt, since)
        assert "".join(expected).encode() == b"".join(text for text, _ in blocks)
        assert len(expected) - (1 if fmt == "csv" else 0) == sum(rows for _, rows in blocks)
    assert 2 == len(blocks) - (1 if fmt == "csv" else 0)  # the ranges (8, 16] and (16, 24]


@pytest.mark.parametrize("mode", ["wb", "ab"], ids=["spliced", "copied"])
def test_export_in_workers_into_a_file_writes_the_same_text(
    shared_db: Database, tmp_path: Path, mode: str
) -> None:
    """Blocks moved by the kernel from the workers' pipes into the file (`into`), or copied
    where the file cannot take a splice (one opened to append): the same text as one process
    writes, the CSV header written by the caller in between."""
    append_old_rows(shared_db, 5)
    append_rows(shared_db, 6, ROWS - 5)
    target = tmp_path / "audit.csv"
    with shared_db.read() as session, target.open(mode) as stream:
        blocks = audit.export_blocks(
            session, "csv", workers=2, chunk_rows=CHUNK, into=stream.fileno()
        )
        counted = 0
        for text, rows in blocks:
            stream.write(text)
            stream.flush()
            counted += rows
    expected = exported_by_decoding(shared_db, "csv")
    assert "".join(expected).encode() == target.read_bytes()
    assert len(expected) - 1 == counted


def test_export_stops_early_without_leaving_a_cursor_open(database: Database) -> None:
    """A reader that takes one line and closes the export can go on using its session."""
    append_rows(database, 1, 5)
    with database.read() as session:
        lines = audit.export(session, "jsonl")
        assert 1 == json.loads(next(lines))["id"]
        lines.close()
        assert audit.VerifyReport(ok=True, checked=5) == audit.verify(session)


def test_export_names_a_row_whose_json_does_not_parse(database: Database) -> None:
    """An unreadable row stops the export with its id, not a bare decoding error."""
    append_rows(database, 1, 2)
    if database.dialect == "postgresql":
        pytest.skip("PostgreSQL's json type never stores text that does not parse")
    tamper(database, sa.text("UPDATE audit SET facts = '{oops' WHERE id = 2"))
    with database.read() as session, pytest.raises(ValueError, match="audit row 2 cannot"):
        list(audit.export(session, "jsonl"))


# ---- memory ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_verify_and_export_of_a_big_log_keep_memory_flat(shared_db: Database) -> None:
    """12,000 rows (about 10 MB of text, twice that as Python strings): verify and export
    stream them, their Python allocations peaking at a few MB (a fetch of 1,000 rows)."""
    rows = 12_000
    insert_chain(shared_db.url.render_as_string(hide_password=False), rows)
    with shared_db.read() as session:
        tracemalloc.start()
        try:
            report = audit.verify(session, workers=1)
            _, verify_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            exported = sum(len(line) for line in audit.export(session, "jsonl"))
            _, export_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert audit.VerifyReport(ok=True, checked=rows) == report
    assert exported > 10_000_000
    assert verify_peak < 5_000_000
    assert export_peak < 5_000_000


# ---- the command line ------------------------------------------------------------------------


def test_the_commands_verify_in_workers_and_name_an_unreadable_row(tmp_path: Path) -> None:
    """`gpubot audit verify` over more than one range of ids (checked in worker processes
    where the command can fork them); an export that meets a row it cannot read says which,
    and exits 2, no traceback."""
    url = f"sqlite:///{tmp_path / 'gpubot.db'}"
    migrate.upgrade(url)
    insert_chain(url, audit.CHUNK_ROWS + 10)
    ok = gpubot("audit", "verify", "--database-url", url)
    assert (0, f"OK: {audit.CHUNK_ROWS + 10} audit rows, hash chain intact\n") == (
        ok.exit_code,
        ok.stdout,
    )
    with closing(sqlite3.connect(tmp_path / "gpubot.db")) as raw, raw:
        raw.execute("UPDATE audit SET facts = '{oops' WHERE id = 7")
    failed = gpubot("audit", "verify", "--database-url", url)
    assert 1 == failed.exit_code
    assert failed.stderr.startswith("FAILED: audit row 7 was altered (first bad row id 7;")
    output = tmp_path / "audit.jsonl"
    refused = gpubot(
        "audit", "export", "--format", "jsonl", "-o", str(output), "--database-url", url
    )
    assert 2 == refused.exit_code
    assert refused.stderr.startswith("error: audit row 7 cannot be exported: its time or JSON")


def test_the_export_command_writes_a_big_log_from_its_workers_into_the_file(
    tmp_path: Path,
) -> None:
    """`gpubot audit export -o FILE` over more than one range: the workers' text goes into
    the file as one process would write it."""
    url = f"sqlite:///{tmp_path / 'gpubot.db'}"
    migrate.upgrade(url)
    rows = audit.EXPORT_CHUNK_ROWS + 7
    insert_chain(url, rows)
    output = tmp_path / "audit.jsonl"
    done = gpubot("audit", "export", "--format", "jsonl", "-o", str(output), "--database-url", url)
    assert (0, f"wrote {rows} audit rows to {output}\n") == (done.exit_code, done.stderr)
    database = Database(url)
    try:
        with database.read() as session:
            expected = "".join(audit.export(session, "jsonl")).encode()
    finally:
        database.dispose()
    assert expected == output.read_bytes()


@pytest.mark.postgres
@pytest.mark.slow
def test_the_scale_benchmark_measures_a_small_log(postgres_url: str) -> None:
    """`tests.bench.audit_scale.measure` on an empty database (PostgreSQL: the harder path,
    COPY and a snapshot): migrated, filled, verified and exported by the commands, its figures
    named as other benchmarks read them."""
    figures = measure(postgres_url, rows=3_000)
    assert {"rows", "verify_s", "export_s", "verify_rss_mb", "export_rss_mb"} <= set(figures)
    assert 3_000 == figures["rows"]
    assert figures["export_mb"] > 2


def test_a_worker_that_cannot_start_its_work_is_reported_not_waited_for(tmp_path: Path) -> None:
    """A worker whose database cannot be opened ends; the reader says so instead of hanging."""
    source = audit_reads.Source("sqlite", str(tmp_path / "missing" / "gpubot.db"))
    pool = audit_workers.Workers(source, "verify", [(0, 8), (8, 16)], 2)
    try:
        with pytest.raises(audit_workers.WorkerError, match="ended early"):
            list(audit_workers.spans(pool))
    finally:
        pool.close()
