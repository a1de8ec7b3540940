"""The live policy: the revision in force, decided through, and replaced only when a new one
loads, compiles and passes its test cases (invariant 7: a broken rule file never replaces
working rules)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Literal

from rules.decision import Decision
from rules.domain import Subject
from rules.engine import RevisionRetiredError, RuleEngine, decide, run_cases
from rules.engine.reference import ReferenceEngine
from rules.errors import PolicyError, Problem
from rules.loader import load_policy
from rules.policy import Policy

EngineName = Literal["durable", "reference"]


def build_engine(policy: Policy, prefer: EngineName = "durable") -> RuleEngine:
    """The durable engine, or the reference where durable cannot be imported."""
    if prefer == "durable":
        try:
            # Imported here so a missing or broken durable build leaves the reference working.
            from rules.engine.durable import DurableEngine  # noqa: PLC0415
        except ImportError:
            pass
        else:
            return DurableEngine(policy)
    return ReferenceEngine(policy)


def check(policy: Policy, engine: RuleEngine) -> None:
    """Run the policy's cases; raise PolicyError naming each failing one."""
    failures = [r for r in run_cases(policy, engine) if not r.passed]
    if failures:
        raise PolicyError(
            [
                Problem(r.case.file, r.case.line, 1, f"case {r.case.name!r}: {r.message}")
                for r in failures
            ]
        )


def compile_checked(sources: Mapping[str, str], prefer: EngineName) -> tuple[Policy, RuleEngine]:
    policy = load_policy(sources)
    engine = build_engine(policy, prefer)
    try:
        check(policy, engine)
    except BaseException:
        engine.close()
        raise
    return policy, engine


class LivePolicy:
    """Holds the policy revision in force; decide() never sees a half-swapped state."""

    def __init__(self, sources: Mapping[str, str], prefer: EngineName = "durable") -> None:
        self._prefer: EngineName = prefer
        self._current = compile_checked(sources, prefer)
        self._swap = threading.Lock()

    @property
    def policy(self) -> Policy:
        return self._current[0]

    @property
    def engine_name(self) -> str:
        return self._current[1].name

    def current(self) -> tuple[Policy, RuleEngine]:
        """The revision in force and its engine, as one atomic view (for rules.memo)."""
        return self._current

    def decide(self, subject: Subject, facts: Mapping[str, Any]) -> Decision:
        while True:
            policy, engine = self._current  # one attribute read: an atomic view of the swap
            try:
                return decide(policy, engine, subject, facts)
            except RevisionRetiredError:
                continue  # raced with reload: the new revision answers

    def reload(self, sources: Mapping[str, str]) -> Policy:
        """Load, compile and check the new files; swap and free the old revision.

        Raises PolicyError and leaves the revision in force untouched when anything fails.
        """
        new = compile_checked(sources, self._prefer)
        with self._swap:
            old, self._current = self._current, new
        old[1].close()
        return new[0]

    def close(self) -> None:
        self._current[1].close()
