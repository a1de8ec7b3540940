"""`gpubot audit verify|export`: the hash chain checked, the log written as CSV or JSON lines."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.cli.common import parse_since
from storage import audit
from storage.db import Database
from tests.unit.bot.cli.builders import NOW, gpubot


def an_entry(n: int) -> audit.AuditEntry:
    return audit.AuditEntry(
        actor=f"U{n}",
        tag="lease:granted",
        subject=f"lease:{n}",
        outcome="approve",
        deciding_rule="within-nominal",
        matching_rules=("within-nominal",),
        facts={"request.gpus": n},
        revision="3f2a9c",
        engine="durable",
    )


def append(database: Database, *times: datetime) -> None:
    for n, at in enumerate(times, 1):
        with database.write() as session:
            audit.append(session, an_entry(n), at=at)


def test_audit_verify_reports_an_intact_chain(url: str, database: Database) -> None:
    """Three appended rows verify; exit 0."""
    append(database, NOW, NOW, NOW)
    result = gpubot("audit", "verify", "--database-url", url)
    assert 0 == result.exit_code, result.output
    assert "OK: 3 audit rows, hash chain intact\n" == result.stdout


def test_audit_verify_names_the_first_edited_row_and_exits_1(
    url: str, database: Database, tmp_path: Path
) -> None:
    """An UPDATE behind the bot's back is caught at row 2."""
    append(database, NOW, NOW, NOW)
    with sqlite3.connect(tmp_path / "x.db") as raw:
        raw.execute("UPDATE audit SET actor='x' WHERE id=2")
    raw.close()
    result = gpubot("audit", "verify", "--database-url", url)
    assert 1 == result.exit_code
    assert result.stderr.startswith("FAILED: audit row 2 was altered (first bad row id 2;")


def test_audit_verify_of_a_database_never_upgraded_says_what_to_run(tmp_path: Path) -> None:
    """No file is created for a missing SQLite database; exit 2 pointing at db upgrade."""
    result = gpubot("audit", "verify", "--database-url", f"sqlite:///{tmp_path}/none.db")
    assert 2 == result.exit_code
    assert "run `gpubot db upgrade`" in result.stderr
    assert not (tmp_path / "none.db").exists()


def test_audit_verify_of_an_empty_unmigrated_database_says_what_to_run(tmp_path: Path) -> None:
    """An existing file without the schema is refused the same way."""
    sqlite3.connect(tmp_path / "bare.db").close()
    result = gpubot("audit", "verify", "--database-url", f"sqlite:///{tmp_path}/bare.db")
    assert 2 == result.exit_code
    assert "has no gpubot schema; run `gpubot db upgrade`" in result.stderr


@pytest.fixture
def three_days(database: Database) -> datetime:
    """Rows 3 days, 1 day and 1 hour old; returns now."""
    now = datetime.now(UTC)
    append(database, now - timedelta(days=3), now - timedelta(days=1), now - timedelta(hours=1))
    return now


def test_audit_export_csv_since_a_duration_keeps_the_recent_rows(
    url: str, three_days: datetime
) -> None:
    """--since 2d: a header and the two rows younger than two days."""
    result = gpubot("audit", "export", "--format", "csv", "--since", "2d", "--database-url", url)
    assert 0 == result.exit_code, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert ["2", "3"] == [row["id"] for row in rows]
    assert list(audit.EXPORT_COLUMNS) == list(rows[0])


def test_audit_export_jsonl_since_a_naive_iso_time_reads_it_as_utc(
    url: str, three_days: datetime, tmp_path: Path
) -> None:
    """A naive ISO time is UTC; --output writes the file and says how many rows."""
    since = (three_days - timedelta(days=2)).replace(tzinfo=None).isoformat(timespec="minutes")
    out = tmp_path / "audit.jsonl"
    result = gpubot(
        "audit", "export", "--format", "jsonl", "--since", since, "-o", str(out),
        "--database-url", url,
    )  # fmt: skip
    assert 0 == result.exit_code, result.output
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [2, 3] == [r["id"] for r in records]
    assert f"wrote 2 audit rows to {out}\n" == result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "xml"], "Invalid value for '--format'"),
        (["--format", "csv", "--since", "last tuesday"], "error: --since: expected an ISO"),
        (["--format", "csv", "-o", "/no/such/dir/a.csv"], "error: cannot write /no/such/dir/a.csv"),
    ],
    ids=["format", "since", "output"],
)
def test_audit_export_refuses_bad_options_with_exit_2(
    url: str, args: list[str], message: str
) -> None:
    """A bad format, time or output file is a message, never a traceback."""
    result = gpubot("audit", "export", *args, "--database-url", url)
    assert 2 == result.exit_code
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2d", NOW - timedelta(days=2)),
        ("1h30m", NOW - timedelta(minutes=90)),
        ("2025-03-01", datetime(2025, 3, 1, tzinfo=UTC)),
        ("2025-03-01T12:00", datetime(2025, 3, 1, 12, tzinfo=UTC)),
        ("2025-03-01T12:00+02:00", datetime(2025, 3, 1, 10, tzinfo=UTC)),
    ],
)
def test_since_is_a_duration_back_from_now_or_an_iso_time_in_utc(
    text: str, expected: datetime
) -> None:
    """Durations count back from now; naive times are UTC; offsets are converted."""
    assert expected == parse_since(text, NOW)
