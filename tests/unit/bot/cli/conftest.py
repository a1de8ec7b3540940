"""Fixtures of the CLI tests: no developer setting leaks in; a migrated SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import migrate
from storage.db import Database


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
        url = str(request.getfixturevalue("postgres_url"))
    else:
        url = f"sqlite:///{tmp_path}/x.db"
    migrate.upgrade(url)
    return url


@pytest.fixture
def database(url: str) -> Iterator[Database]:
    db = Database(url)
    yield db
    db.dispose()
