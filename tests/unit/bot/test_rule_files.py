"""Reading a rules directory: YAML files only, hidden copies and editor leftovers skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.services.rule_files import RulesDirError, read_rules_dir


def test_a_configmap_mount_is_read_once(tmp_path: Path) -> None:
    """Kubernetes mounts the files twice (the ..data copy is hidden); only one copy counts."""
    hidden = tmp_path / "..2026_11_29_10_00_00.123"
    (hidden / "tests").mkdir(parents=True)
    (hidden / "org.yaml").write_text("admins: [U0ADMIN01]\n")
    (hidden / "tests" / "cases.yaml").write_text("cases: []\n")
    (tmp_path / "org.yaml").write_text("admins: [U0ADMIN01]\n")
    (tmp_path / ".org.yaml.swp").write_text("junk")
    (tmp_path / "notes.txt").write_text("not a rule file")
    assert ["org.yaml"] == list(read_rules_dir(tmp_path))


def test_a_missing_or_empty_directory_says_so(tmp_path: Path) -> None:
    """Clear errors instead of an empty policy."""
    with pytest.raises(RulesDirError, match="no such rules directory"):
        read_rules_dir(tmp_path / "nope")
    with pytest.raises(RulesDirError, match="no rule files"):
        read_rules_dir(tmp_path)
