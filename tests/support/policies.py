"""Rule files parsed once per test process: `rules.loader.load_policy` is a pure function of its
sources, and the suite hands it the same shipped files thousands of times (every `Services`,
every assembled bot); parsing and validating them took ~20 ms each, several times that under
coverage. A policy that fails to load raises every time (errors are never kept)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping

from rules import loader
from rules.policy import Policy

_PARSE = loader.load_policy


@functools.lru_cache(maxsize=64)
def _loaded(sources: tuple[tuple[str, str], ...]) -> Policy:
    return _PARSE(dict(sources))


def load_policy(sources: Mapping[str, str]) -> Policy:
    """The Policy of `sources`, the same object for the same texts (a Policy is frozen)."""
    return _loaded(tuple(sorted(sources.items())))


def parse_once() -> None:
    """Every `load_policy` reached by name, from `rules.loader` or imported from it, keeps the
    policies it built; modules imported later take the kept one from `rules.loader`."""
    loader.load_policy = load_policy
    for module in list(sys.modules.values()):
        if getattr(module, "load_policy", None) is _PARSE:
            module.load_policy = load_policy  # type: ignore[attr-defined]
