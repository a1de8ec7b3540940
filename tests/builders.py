"""Plain builders shared by the test layers: the default rule files and facts with overrides."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from rules.loader import load_policy
from rules.policy import Policy

POLICIES = Path(__file__).resolve().parent.parent / "rules" / "policies"


def default_sources() -> dict[str, str]:
    """The shipped rule files as {relative path: text}."""
    return {
        str(p.relative_to(POLICIES)): p.read_text(encoding="utf-8")
        for p in sorted(POLICIES.rglob("*.yaml"))
    }


@cache
def default_policy() -> Policy:
    return load_policy(default_sources())


def _baseline(name: str) -> dict[str, Any]:
    """The facts of a shipped case that changes nothing from its file's defaults."""
    return dict(next(c for c in default_policy().cases if c.name == name).facts)


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    return {**base, **{k.replace("__", "."): v for k, v in overrides.items()}}


def a_request(**overrides: Any) -> dict[str, Any]:
    """Request facts: alice (vision) borrows 2 a100 for 6h with room to spare.

    Keyword names use `__` for dots: a_request(request__gpus=4).
    """
    return _merge(_baseline("a small borrow inside nominal is approved at once"), overrides)


def a_lease(**overrides: Any) -> dict[str, Any]:
    """Lease facts: a busy lease three hours from expiry."""
    return _merge(_baseline("a busy lease far from expiry is left alone"), overrides)


def a_gpu(**overrides: Any) -> dict[str, Any]:
    """GPU facts: a healthy, leased, busy GPU."""
    return _merge(_baseline("a healthy busy GPU is left alone"), overrides)
