"""Reading a rules directory into {relative path: text}, the form rules.policy loads."""

from __future__ import annotations

from pathlib import Path


class RulesDirError(OSError):
    """The rules directory is missing or holds no rule files."""


def read_rules_dir(directory: Path) -> dict[str, str]:
    """Every *.yaml and *.yml below `directory`, keyed by its path relative to it."""
    if not directory.is_dir():
        raise RulesDirError(f"{directory}: no such rules directory")
    # Hidden paths are skipped: a Kubernetes ConfigMap mount keeps a second copy of every file
    # under ..<timestamp>/, and editors leave .swp and backup files beside the rules.
    files = sorted(
        p
        for p in directory.rglob("*")
        if p.suffix in (".yaml", ".yml")
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )
    if not files:
        raise RulesDirError(f"{directory}: no rule files (*.yaml) found")
    return {p.relative_to(directory).as_posix(): p.read_text(encoding="utf-8") for p in files}
