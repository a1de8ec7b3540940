"""The Slack adapter's modules import one way: the app builds the listeners, never the reverse."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_architecture import ROOT, dotted_imports_of

SLACK = ROOT / "bot" / "slack"


def _importers_of(module: str, under: Path) -> list[str]:
    return sorted(
        str(p.relative_to(ROOT)) for p in under.rglob("*.py") if module in dotted_imports_of(p)
    )


def test_no_listener_imports_the_app() -> None:
    """Listeners take their deps from bot.slack.deps, even for type checking: no cycle."""
    assert [] == _importers_of("bot.slack.app", SLACK / "listeners")


def test_the_deps_import_no_listener_and_not_the_app() -> None:
    """bot.slack.deps is what listeners share; it knows nothing of them or of the app."""
    imported = dotted_imports_of(SLACK / "deps.py")
    assert [] == [n for n in imported if n.startswith(("bot.slack.app", "bot.slack.listeners"))]
