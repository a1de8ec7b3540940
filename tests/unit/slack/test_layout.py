"""The Slack adapter's modules import one way: the app builds the listeners, never the reverse."""

from __future__ import annotations

from tests.imports import all_imports


def _importers_of(module: str, under: str) -> list[str]:
    """Modules under `under` that import `module`, at any level (TYPE_CHECKING included)."""
    return sorted(
        {i.source for i in all_imports() if i.source.startswith(under) and i.target == module}
    )


def _imported_by(module: str) -> list[str]:
    return sorted({i.target for i in all_imports() if i.source == module})


def test_no_listener_imports_the_app() -> None:
    """Listeners take their deps from bot.slack.deps, even for type checking: no cycle."""
    assert [] == _importers_of("bot.slack.app", "bot.slack.listeners")


def test_the_deps_import_no_listener_and_not_the_app() -> None:
    """bot.slack.deps is what listeners share; it knows nothing of them or of the app."""
    imported = _imported_by("bot.slack.deps")
    assert [] == [n for n in imported if n.startswith(("bot.slack.app", "bot.slack.listeners"))]
