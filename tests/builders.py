"""Plain builders shared by the test layers: the default rule files and facts with overrides."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from bot.telemetry.model import ProcessInfo, Sample
from rules.loader import load_policy
from rules.policy import Policy

POLICIES = Path(__file__).resolve().parent.parent / "rules" / "policies"


def default_sources() -> dict[str, str]:
    """The shipped rule files as {relative path: text}."""
    return {
        str(p.relative_to(POLICIES)): p.read_text(encoding="utf-8")
        for p in sorted(POLICIES.rglob("*.yaml"))
    }


QUOTA_RULES = ("beyond-borrowing-limit", "lenders-have-too-little")


def permissive_sources() -> dict[str, str]:
    """The shipped rule files less the rules that keep teams within their quotas (and the
    cases those rules decide): what the code enforces whatever the files say."""
    sources = default_sources()
    rules_head, *rules = sources["requests.yaml"].split("\n  - id: ")
    kept = [r for r in rules if r.split("\n", 1)[0].strip() not in QUOTA_RULES]
    sources["requests.yaml"] = "\n  - id: ".join([rules_head, *kept])
    cases_head, *cases = sources["tests/requests.yaml"].split("\n  - name: ")
    deciding = tuple(f"deciding: {rule}" for rule in QUOTA_RULES)
    kept = [c for c in cases if not any(d in c for d in deciding)]
    sources["tests/requests.yaml"] = "\n  - name: ".join([cases_head, *kept])
    return sources


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


def a_sample(
    node: str, index: int, util: float | None, at: datetime, *, error: str | None = None
) -> Sample:
    """One GPU reading from an A100 with alice's process on it."""
    return Sample(
        node=node,
        index=index,
        uuid=f"GPU-{node}-{index}",
        model="NVIDIA A100-SXM4-80GB",
        memory_total_mib=81920,
        memory_used_mib=30000,
        util_pct=util,
        temperature_c=40.0,
        power_w=90.0,
        health="ok",
        processes=(ProcessInfo(pid=4000 + index, user="alice"),),
        taken_at=at,
        error=error,
    )


def sources_with(section: str, text: str) -> dict[str, str]:
    """The shipped rule files with one top-level section of limits.yaml replaced by `text`
    (e.g. sources_with("queue", "queue: {backfill: none}"))."""
    sources = default_sources()
    lines = sources["limits.yaml"].splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{section}:"))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "")),
        len(lines),
    )
    sources["limits.yaml"] = "".join([*lines[:start], text.rstrip("\n") + "\n", *lines[end:]])
    return sources


@dataclass(frozen=True)
class Seen:
    """A reading as the telemetry window gives it."""

    fresh: bool = True
    healthy: bool = True
    health: str = "ok"
    util_pct: float | None = 0.0
    memory_used_mib: int | None = 0
    processes: Sequence[Any] = field(default_factory=tuple)
    idle_for: timedelta = timedelta(hours=2)
