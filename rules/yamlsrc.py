"""YAML parsing that remembers where every key and value stood, for file:line:col errors."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from rules.errors import PolicyError, Problem

Path = tuple[str | int, ...]


@dataclass
class Located:
    """A parsed YAML document plus the 1-based position of each path in it."""

    file: str
    data: Any
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)
    plain: dict[Path, bool] = field(default_factory=dict)

    def at(self, path: Path, message: str, *, key: bool = False, offset: int = 0) -> Problem:
        """A Problem at `path`, or at its nearest located ancestor when the path is absent.

        `offset` moves the column inside a scalar (for an error inside an expression).
        """
        table = self.keys if key else self.values
        probe = path
        while probe not in table and probe not in self.values and probe:
            probe = probe[:-1]
        line, col = table.get(probe) or self.values.get(probe, (1, 1))
        if probe == path and offset:
            col += offset + (0 if self.plain.get(path, True) else 1)
        return Problem(self.file, line, col, message)


class _Loader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 scalars: `on`, `yes` and `no` stay words (`on: request` is a
    key, not `True`), only true/false are booleans, and timestamps stay strings."""


_DROPPED = {"tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:bool"}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _DROPPED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


# libyaml's parser, where PyYAML was built with it: the same nodes and marks, about ten times
# faster than the Python one (every bot start, reload and rules check parses every rule file).
_FastLoader: type[yaml.CSafeLoader] | None = None
if getattr(yaml, "__with_libyaml__", False):

    class _FastLoader(yaml.CSafeLoader):  # type: ignore[no-redef]
        """`_Loader`'s scalars on libyaml's parser."""

        yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers


def parse(file: str, text: str) -> Located:
    """Parse one YAML document; syntax errors become a PolicyError with the position."""
    if _FastLoader is None or "\t" in text:
        # libyaml takes some tabs the Python parser refuses (`a: b\t# c`): a file with a tab is
        # read as it always was, so whether it loads never depends on how PyYAML was built.
        loader, node = _compose(_Loader, file, text)
    else:
        try:
            loader, node = _compose(_FastLoader, file, text)
        except PolicyError:
            # libyaml words its syntax errors its own way: the Python parser finds the same
            # error and names it as these messages always have.
            loader, node = _compose(_Loader, file, text)
    located = Located(file, None)
    if node is not None:
        located.data = _build(loader, node, (), located)
    return located


def _compose(kind: Callable[[str], Any], file: str, text: str) -> tuple[Any, yaml.Node | None]:
    """A loader of `kind` and the document's root node (None when empty)."""
    loader = kind(text)
    try:
        return loader, loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise PolicyError([Problem(file, line, col, f"YAML: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise PolicyError([Problem(file, 1, 1, f"YAML: {exc}")]) from None
    finally:
        loader.dispose()


def _build(loader: SafeConstructor, node: yaml.Node, path: Path, out: Located) -> Any:
    out.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, list | dict):
                raise PolicyError(
                    [out.at(path, "a key must be a plain word, not a list or mapping")]
                )
            child = (*path, key)
            if key in result:
                line, col = key_node.start_mark.line + 1, key_node.start_mark.column + 1
                raise PolicyError([Problem(out.file, line, col, f"duplicate key {key!r}")])
            out.keys[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _build(loader, value_node, child, out)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, (*path, i), out) for i, item in enumerate(node.value)]
    # A plain scalar's style is None from the Python parser, "" from libyaml's.
    out.plain[path] = isinstance(node, yaml.ScalarNode) and not node.style
    return loader.construct_object(node, deep=True)
