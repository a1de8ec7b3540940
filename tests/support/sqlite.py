"""A SQLite file migrated to head, to copy where a test's bot will open its database: the bot
then finds it at head, as after any restart, instead of running every migration again for each
test. The migrations keep their own tests (tests/unit/storage/test_migrations.py), and each
`gpubot serve` of tests/support/serve.py still starts from an empty file."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from storage import migrate


@functools.cache
def migrated() -> Path:
    """The file, migrated once per process (removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="gpubot-migrated-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "gpubot.db"
    migrate.upgrade(f"sqlite:///{path}")
    # Every connection is closed: the WAL was checkpointed into the file, which alone is whole.
    assert not path.with_name(path.name + "-wal").exists()
    return path


def migrated_copy(file: Path) -> Path:
    """`file`, made a copy of the migrated one unless it exists already."""
    if not file.exists():
        shutil.copyfile(migrated(), file)
    return file
