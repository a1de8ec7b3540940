"""The admin CLI: rules check with file:line:col problems, db upgrade, audit verify and export,
the leases table, and one-line errors (exit 2) instead of tracebacks."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from typer.testing import CliRunner, Result

from bot.cli import app, parse_since
from storage import audit, migrate
from storage.db import Database
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, NodeRow, PoolRow
from tests.builders import POLICIES, default_policy

GPUBOT = Path(sys.executable).parent / "gpubot"
ROOT = POLICIES.parents[1]
NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
HEAD = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GPUBOT_* variable or .env file of the developer's leaks into a test."""
    for name in ("GPUBOT_DATABASE_URL", "GPUBOT_RULES_DIR", "GPUBOT_RULES_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A migrated SQLite file."""
    url = f"sqlite:///{tmp_path}/x.db"
    migrate.upgrade(url)
    return url


@pytest.fixture
def database(url: str) -> Iterator[Database]:
    db = Database(url)
    yield db
    db.dispose()


def gpubot(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def a_copy_of_the_rules(tmp_path: Path) -> Path:
    copy = tmp_path / "policies"
    shutil.copytree(POLICIES, copy)
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if needle in line)


# ---- rules check ------------------------------------------------------------------------

OK_LINE = (
    "OK: 27 rules (17 request, 8 lease, 2 gpu), 38 cases passed; "
    f"revision {default_policy().revision}; engine durable"
)


@pytest.mark.durable
def test_rules_check_passes_the_shipped_rules_with_a_one_line_summary() -> None:
    """The shipped policy loads, compiles on durable and passes every case."""
    result = gpubot("rules", "check", str(POLICIES))
    assert 0 == result.exit_code, result.output
    assert OK_LINE + "\n" == result.stdout


def test_rules_check_reads_the_directory_from_gpubot_rules_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With no DIR argument the settings' rules directory is checked."""
    copy = a_copy_of_the_rules(tmp_path)
    edit(copy / "requests.yaml", "request.gpus > limits", "request.gpu > limits")
    monkeypatch.setenv("GPUBOT_RULES_DIR", str(copy))
    result = gpubot("rules", "check")
    assert 2 == result.exit_code
    assert f"{copy}/requests.yaml:10:11: unknown fact `request.gpu`" in result.stderr


def test_rules_check_can_run_the_cases_on_the_reference_engine() -> None:
    """--engine reference overrides GPUBOT_RULES_ENGINE and is named in the summary."""
    result = gpubot("rules", "check", str(POLICIES), "--engine", "reference")
    assert 0 == result.exit_code, result.output
    assert result.stdout.rstrip().endswith("engine reference")


def test_rules_check_names_the_line_and_column_of_an_unknown_fact(tmp_path: Path) -> None:
    """A typo in a `when` exits 2 with the file under DIR, line and column, then a summary."""
    copy = a_copy_of_the_rules(tmp_path)
    edit(copy / "requests.yaml", "request.gpus > limits", "request.gpu > limits")
    result = gpubot("rules", "check", str(copy))
    assert 2 == result.exit_code
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"{copy}/requests.yaml:10:11: unknown fact `request.gpu`")
    assert result.stderr.splitlines()[-1].startswith("FAILED: ")
    assert "" == result.stdout


def test_rules_check_names_a_failing_case_and_where_it_is(tmp_path: Path) -> None:
    """A case whose expectation no longer holds exits 2 naming the case and its line."""
    copy = a_copy_of_the_rules(tmp_path)
    cases = copy / "tests" / "requests.yaml"
    edit(
        cases,
        "    facts: {request.duration: 4d}\n    expect: deny",
        "    facts: {request.duration: 4d}\n    expect: approve",
    )
    line = line_of(cases, "name: longer than the pool allows is denied")
    result = gpubot("rules", "check", str(copy))
    assert 2 == result.exit_code
    expected = (
        f"{cases}:{line}:1: case 'longer than the pool allows is denied': "
        "expected approve, got deny"
    )
    assert result.stderr.startswith(expected)
    assert "FAILED: 1 of 38 cases failed" in result.stderr


def test_rules_check_of_a_missing_directory_exits_2_without_a_traceback(tmp_path: Path) -> None:
    """A directory that is not there is one error line."""
    result = gpubot("rules", "check", str(tmp_path / "nowhere"))
    assert 2 == result.exit_code
    assert f"error: {tmp_path / 'nowhere'}: no such rules directory\n" == result.stderr


def test_an_invalid_setting_in_the_environment_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPUBOT_RULES_ENGINE=fast is refused by name, exit 2."""
    monkeypatch.setenv("GPUBOT_RULES_ENGINE", "fast")
    result = gpubot("rules", "check", str(POLICIES))
    assert 2 == result.exit_code
    assert result.stderr.startswith("error: invalid settings: GPUBOT_RULES_ENGINE: ")


@pytest.mark.durable
def test_the_installed_script_checks_the_shipped_rules() -> None:
    """The real `gpubot` console script runs `rules check` and exits 0."""
    done = subprocess.run(  # noqa: S603  (our own console script, fixed arguments)
        [str(GPUBOT), "rules", "check", "rules/policies"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (0, OK_LINE + "\n") == (done.returncode, done.stdout), done.stderr


def test_the_installed_script_points_an_editor_at_the_broken_rule(tmp_path: Path) -> None:
    """Through the real script: exit 2 and `<dir>/requests.yaml:10:11: unknown fact` on stderr."""
    copy = a_copy_of_the_rules(tmp_path)
    edit(copy / "requests.yaml", "request.gpus > limits", "request.gpu > limits")
    done = subprocess.run(  # noqa: S603  (our own console script, fixed arguments)
        [str(GPUBOT), "rules", "check", "policies"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 2 == done.returncode
    assert "policies/requests.yaml:10:11: unknown fact `request.gpu`" in done.stderr
    assert "Traceback" not in done.stderr


# ---- db upgrade -------------------------------------------------------------------------


def test_db_upgrade_creates_the_schema_and_says_which_revision(tmp_path: Path) -> None:
    """A new SQLite file is migrated to head; running it again changes nothing."""
    url = f"sqlite:///{tmp_path}/new.db"
    first = gpubot("db", "upgrade", "--database-url", url)
    again = gpubot("db", "upgrade", "--database-url", url)
    assert 0 == first.exit_code, first.output
    assert f"OK: {url} upgraded from nothing to schema revision {HEAD}\n" == first.stdout
    assert f"OK: {url} is already at schema revision {HEAD}\n" == again.stdout
    assert HEAD == migrate.current(url)


def test_db_upgrade_reads_gpubot_database_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without --database-url the settings' URL is migrated."""
    url = f"sqlite:///{tmp_path}/env.db"
    monkeypatch.setenv("GPUBOT_DATABASE_URL", url)
    result = gpubot("db", "upgrade")
    assert 0 == result.exit_code, result.output
    assert HEAD == migrate.current(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///{tmp}/no/such/dir/x.db", "error: cannot use the database at sqlite:///"),
        ("postgresql://gpubot:s3cret@127.0.0.1:1/gpubot", "error: cannot use the database at "),
        ("not a url", "error: bad database URL: expected e.g. sqlite:///gpubot.db"),
    ],
    ids=["sqlite-dir-missing", "postgres-refused", "unparseable"],
)
def test_db_upgrade_of_an_unreachable_database_is_one_line_and_exit_2(
    tmp_path: Path, url: str, message: str
) -> None:
    """No traceback, and never the password."""
    result = gpubot("db", "upgrade", "--database-url", url.format(tmp=tmp_path))
    assert 2 == result.exit_code
    assert result.stderr.startswith(message)
    assert 1 == len(result.stderr.splitlines())
    assert "s3cret" not in result.output


# ---- audit ------------------------------------------------------------------------------


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


# ---- leases -----------------------------------------------------------------------------


def four_gpus(database: Database) -> dict[int, int]:
    """Pool a100 with one node of four GPUs; {index: gpu id}."""
    with database.write() as session:
        # Flush parents first: without relationship()s the ORM does not order inserts by FK.
        session.add(PoolRow(name="a100"))
        session.flush()
        node = NodeRow(name="a100-node-01", pool="a100")
        session.add(node)
        session.flush()
        assert node.id is not None
        gpus = [GpuRow(node_id=node.id, index=i, pool="a100") for i in range(4)]
        session.add_all(gpus)
        session.flush()
        return {g.index: g.id for g in gpus if g.id is not None}


def a_lease(database: Database, gpu_ids: list[int], *, state: str, expires_at: datetime) -> None:
    with database.write() as session:
        lease = LeaseRow(
            holder="U0ALICE01",
            team="vision",
            pool="a100",
            gpus=len(gpu_ids),
            state=state,
            granted_at=NOW,
            expires_at=expires_at,
        )
        session.add(lease)
        session.flush()
        assert lease.id is not None
        active = state == "active"
        session.add_all(LeaseGpuRow(lease_id=lease.id, gpu_id=g, active=active) for g in gpu_ids)


def test_leases_shows_an_active_lease_with_its_gpus_times_and_time_left(
    url: str, database: Database
) -> None:
    """One row: code, holder, team, pool, node:indices, UTC times, time left, state."""
    gpus = four_gpus(database)
    expires = datetime.now(UTC) + timedelta(hours=5, minutes=12, seconds=30)
    a_lease(database, [gpus[0], gpus[1]], state="active", expires_at=expires)
    result = gpubot("leases", "--database-url", url)
    assert 0 == result.exit_code, result.output
    row = next(line for line in result.stdout.splitlines() if "L1" in line)
    cells = [cell.strip() for cell in row.split("│")]
    expected = [
        "L1",
        "U0ALICE01",
        "vision",
        "a100",
        "a100-node-01:0,1",
        "2025-03-14 09:30",
        expires.strftime("%Y-%m-%d %H:%M"),
        "5h 12m",
        "active",
    ]
    assert expected == cells


def test_leases_without_an_active_lease_says_so(url: str, database: Database) -> None:
    """An ended lease is hidden unless --all, which shows it with no time left."""
    gpus = four_gpus(database)
    a_lease(database, [gpus[2]], state="released", expires_at=NOW + timedelta(hours=6))
    active = gpubot("leases", "--database-url", url)
    every = gpubot("leases", "--all", "--database-url", url)
    assert (0, "No active leases.\n") == (active.exit_code, active.stdout)
    assert 0 == every.exit_code, every.output
    row = next(line for line in every.stdout.splitlines() if "L1" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert ("a100-node-01:2", "-", "released") == (cells[4], cells[7], cells[8])


def test_leases_of_an_empty_database_says_no_active_leases(url: str) -> None:
    """A fresh database prints the sentence, not an empty table."""
    result = gpubot("leases", "--database-url", url)
    assert (0, "No active leases.\n") == (result.exit_code, result.stdout)
