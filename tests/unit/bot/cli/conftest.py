"""Fixtures of the CLI tests: no developer setting leaks in; a migrated SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.db import Database
from tests.support.sqlite import migrated_copy


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GPUBOT_* variable or .env file of the developer's leaks into a test."""
    for name in ("GPUBOT_DATABASE_URL", "GPUBOT_RULES_DIR", "GPUBOT_RULES_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A migrated SQLite file (a copy of one migrated once, tests/support/sqlite.py)."""
    return f"sqlite:///{migrated_copy(tmp_path / 'x.db')}"


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def url_either(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated SQLite file, then a migrated PostgreSQL database (a module that runs its
    commands on both names it as its `url`)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("migrated_postgres_url"))
    return f"sqlite:///{migrated_copy(tmp_path / 'x.db')}"


@pytest.fixture
def database(url: str) -> Iterator[Database]:
    db = Database(url)
    yield db
    db.dispose()
