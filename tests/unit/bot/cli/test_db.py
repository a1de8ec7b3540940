"""`gpubot db upgrade`: creates or upgrades the schema and says to which revision."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import migrate
from tests.unit.bot.cli.builders import HEAD, gpubot


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
