"""Builders for the CLI tests: the command run in-process, the installed script, a copy of the
shipped rules to break, the fixed clock the audit and lease tests use."""

from __future__ import annotations

import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

from alembic.script import ScriptDirectory
from typer.testing import CliRunner, Result

from bot.cli.app import app
from storage import migrate
from tests.builders import POLICIES

GPUBOT = Path(sys.executable).parent / "gpubot"
ROOT = POLICIES.parents[1]
NOW = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
HEAD = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()


def gpubot(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), prog_name="gpubot")


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
