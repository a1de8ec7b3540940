"""The dependency direction rules <- storage <- bot, read from the imports of every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# rules/ is the pure decision core: no outer layer, no I/O library, no clock-reading service.
RULES_FORBIDDEN = {
    "bot",
    "storage",
    "slack_bolt",
    "slack_sdk",
    "sqlmodel",
    "sqlalchemy",
    "alembic",
    "apscheduler",
    "pynvml",
    "os",
    "pathlib",
    "io",
    "socket",
    "subprocess",
    "shutil",
    "tempfile",
    "sqlite3",
    "urllib",
    "http",
    "requests",
    "httpx",
    "uvicorn",
    "logging",
}


def imports_of(path: Path) -> set[str]:
    """Top-level names of every module a file imports (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", modules("rules"), ids=lambda p: str(p.relative_to(ROOT)))
def test_rules_imports_no_io_and_no_outer_package(path: Path) -> None:
    """rules/ stays pure: nothing from storage/, bot/, Slack, databases, NVML or I/O."""
    assert set() == imports_of(path) & RULES_FORBIDDEN


@pytest.mark.parametrize("path", modules("storage"), ids=lambda p: str(p.relative_to(ROOT)))
def test_storage_never_imports_bot(path: Path) -> None:
    """storage/ depends on rules/ only, never on the composition root."""
    assert "bot" not in imports_of(path)


def test_durable_is_imported_by_exactly_one_module() -> None:
    """Only the engine wrapper sees durable-rules."""
    importers = [
        str(p.relative_to(ROOT))
        for package in ("rules", "storage", "bot")
        for p in modules(package)
        if imports_of(p) & {"durable", "durable_rules_engine"}
    ]
    assert ["rules/engine/durable.py"] == importers


def test_pynvml_is_imported_by_at_most_one_module_in_bot() -> None:
    """NVML stays behind the telemetry source that owns it."""
    importers = [
        str(p.relative_to(ROOT))
        for package in ("rules", "storage", "bot")
        for p in modules(package)
        if "pynvml" in imports_of(p)
    ]
    assert len(importers) <= 1
    assert all(p.startswith("bot/") for p in importers)


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The import reader catches plain, dotted and from-imports."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os.path\nfrom sqlmodel import Session\nfrom . import sibling\n")
    assert {"os", "sqlmodel"} == imports_of(bad)


def dotted_imports_of(path: Path) -> set[str]:
    """Full dotted names of every module a file imports (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# What bot/localslack may take from the product: the in-process transport builds its request
# with the HTTP server's own function, so a test sees exactly what the server would parse.
LOCALSLACK_MAY_IMPORT = {"bot.server"}


def test_only_the_demo_uses_the_local_slack_api() -> None:
    """bot/localslack fakes Slack for the tests and the demo: the product never imports it, and
    it imports nothing of the product (it knows Slack's wire format, not gpubot)."""
    users = sorted(
        str(p.relative_to(ROOT))
        for package in ("rules", "storage", "bot")
        for p in modules(package)
        if not p.is_relative_to(ROOT / "bot" / "localslack")
        and any(name.startswith("bot.localslack") for name in dotted_imports_of(p))
    )
    assert all(p.startswith("bot/workspace/") for p in users), users
    inside = {
        name
        for p in modules("bot/localslack")
        for name in dotted_imports_of(p)
        if name.split(".")[0] in {"bot", "rules", "storage"}
    }
    assert set() == inside - LOCALSLACK_MAY_IMPORT
