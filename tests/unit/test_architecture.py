"""The structure rules, read from the imports of every module (see tests/imports.py).

The dependency direction rules <- storage <- bot, no import cycles, and the rooms inside bot/:
services know no Slack, Block Kit knows no storage, the node agent knows none of the bot's
insides, and only the demo reaches the local Slack workspace.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Collection
from pathlib import Path

import pytest

from tests.imports import (
    ALL_KINDS,
    ROOT,
    RUNTIME,
    Import,
    all_imports,
    cycles,
    graph,
    imports_of,
    modules,
)

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


def within(name: str, *prefixes: str) -> bool:
    """Whether a dotted module name is one of `prefixes` or inside one of them."""
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def names_in(package: str) -> list[str]:
    return [name for name in modules() if within(name, package)]


def top_levels(name: str) -> set[str]:
    """Top-level names of every module one module imports, of any kind."""
    return {found.target.split(".")[0] for found in all_imports() if found.source == name}


def breaches(sources: Collection[str], forbidden: Collection[str]) -> list[str]:
    """`source:line -> target` for each import (any kind) from `sources` into `forbidden`."""
    return [
        f"{found.source}:{found.line} -> {found.target}"
        for found in all_imports()
        if found.source in sources and within(found.target, *forbidden)
    ]


@pytest.mark.parametrize("name", names_in("rules"))
def test_rules_imports_no_io_and_no_outer_package(name: str) -> None:
    """rules/ stays pure: nothing from storage/, bot/, Slack, databases, NVML or I/O."""
    assert set() == top_levels(name) & RULES_FORBIDDEN


@pytest.mark.parametrize("name", names_in("storage"))
def test_storage_never_imports_bot(name: str) -> None:
    """storage/ depends on rules/ only, never on the composition root."""
    assert "bot" not in top_levels(name)


def test_durable_is_imported_by_exactly_one_module() -> None:
    """Only the engine wrapper sees durable-rules."""
    importers = sorted(
        {
            found.source
            for found in all_imports()
            if within(found.target, "durable", "durable_rules_engine")
        }
    )
    assert ["rules.engine.durable"] == importers


def test_pynvml_is_imported_by_at_most_one_module_in_bot() -> None:
    """NVML stays behind the telemetry source that owns it."""
    importers = sorted({found.source for found in all_imports() if within(found.target, "pynvml")})
    assert len(importers) <= 1
    assert all(within(name, "bot") for name in importers)


# --- cycles ---------------------------------------------------------------------------------------


def test_no_import_cycles_at_run_time() -> None:
    """No module imports itself through others, counting imports inside functions."""
    assert [] == cycles(graph(all_imports(), RUNTIME))


def test_no_import_cycles_for_the_type_checker_either() -> None:
    """No cycle hides under `if TYPE_CHECKING:` either: the rooms form a graph, not a knot."""
    assert [] == cycles(graph(all_imports(), ALL_KINDS))


# --- the rooms of bot/ ----------------------------------------------------------------------------

# What the demo's composition root may reach: the local Slack API and the workspace page are for
# the tests and `gpubot demo` only.
DEMO_ONLY = ("bot.localslack", "bot.workspace")
DEMO_ROOTS = ("bot.workspace", "bot.cli")

# What bot/localslack may take from the product: the in-process transport builds its request
# with the HTTP server's own function, so a test sees exactly what the server would parse.
LOCALSLACK_MAY_IMPORT = {"bot.server"}

# The node agent: the bot/agent/ package (its loop and its enforcer).
AGENT = ("bot.agent",)


def test_services_know_no_slack() -> None:
    """Use cases take plain values and return views: no Bolt, no Slack SDK, no bot.slack."""
    assert [] == breaches(names_in("bot.services"), ("slack_bolt", "slack_sdk", "bot.slack"))


def test_block_kit_knows_no_storage() -> None:
    """bot.slack.blocks draws views; it never reads a table."""
    assert [] == breaches(names_in("bot.slack.blocks"), ("storage", "sqlmodel", "sqlalchemy"))


def test_the_agent_knows_nothing_of_the_bot_inside() -> None:
    """The node agent runs on GPU hosts without the bot's database, use cases or Slack app."""
    agent = [name for name in modules() if within(name, *AGENT)]
    assert agent, "the agent's modules moved: update AGENT"
    assert [] == breaches(agent, ("storage", "bot.services", "bot.slack"))


def test_only_the_demo_uses_the_local_slack_workspace() -> None:
    """No product module imports bot.localslack or bot.workspace; only the demo's composition
    root (bot.cli and bot.workspace itself) does."""
    product = [name for name in modules() if not within(name, *DEMO_ONLY, *DEMO_ROOTS)]
    assert [] == breaches(product, DEMO_ONLY)


def test_the_local_slack_api_knows_nothing_of_the_product() -> None:
    """bot/localslack knows Slack's wire format, not gpubot."""
    inside = {
        found.target
        for found in all_imports()
        if within(found.source, "bot.localslack")
        and found.internal
        and not within(found.target, "bot.localslack")
    }
    assert set() == inside - LOCALSLACK_MAY_IMPORT


# --- imports inside functions ---------------------------------------------------------------------

# Function-level imports inside the project whose reason is not written next to them, each with
# the reason. Keep this short: a new one writes its reason in a comment instead.
UNCOMMENTED_LATE_IMPORTS = {
    ("bot.main", "bot.server"): "HTTP mode only; the reason is on the uvicorn import above it",
}

NOQA = re.compile(r"noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?", re.IGNORECASE)


def comments_by_line(path: Path) -> dict[int, str]:
    """The text of each comment in a file, by line, without its noqa codes."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return {
        token.start[0]: NOQA.sub("", token.string.lstrip("#")).strip(" -–—:;()")
        for token in tokens
        if token.type == tokenize.COMMENT
    }


def has_reason(found: Import) -> bool:
    """A comment with words besides noqa codes on the import's line or the line before."""
    comments = comments_by_line(modules()[found.source])
    return any(comments.get(line) for line in (found.line, found.line - 1))


def test_imports_inside_functions_say_why() -> None:
    """An import inside a function hides a dependency: the line says why it is there."""
    silent = [
        f"{found.source}:{found.line} -> {found.target}"
        for found in all_imports()
        if found.internal
        and found.kind == "function"
        and (found.source, found.target) not in UNCOMMENTED_LATE_IMPORTS
        and not has_reason(found)
    ]
    assert [] == silent


# --- the reader itself ----------------------------------------------------------------------------

KNOWN = {"pkg": Path("pkg/__init__.py"), "pkg.a": Path("pkg/a.py"), "pkg.b": Path("pkg/b.py")}


def test_the_reader_resolves_and_classes_each_import() -> None:
    """Plain, dotted, from- and relative imports resolve to modules, classed by where they run."""
    source = (
        "import os.path\n"
        "from sqlmodel import Session\n"
        "from . import b\n"
        "from pkg import helper\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.b import Thing\n"
        "def late():\n"
        "    from .b import other\n"
    )
    found = {(i.target, i.kind) for i in imports_of("pkg.a", source, KNOWN)}
    assert {
        ("os.path", "module"),
        ("sqlmodel", "module"),
        ("pkg.b", "module"),
        ("pkg", "module"),
        ("typing", "module"),
        ("pkg.b", "type_checking"),
        ("pkg.b", "function"),
    } == found


def test_the_reader_finds_a_cycle() -> None:
    """Tarjan's components name every member of a cycle and nothing acyclic."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [["a", "b", "c"]] == cycles(edges)


def test_the_reader_sees_the_whole_tree() -> None:
    """Every package is read, so a guard cannot pass by seeing nothing."""
    names = modules()
    assert {"bot", "rules", "storage"} <= set(names)
    assert all(path.is_relative_to(ROOT) for path in names.values())
