"""Decisions from facts: the engine interface, the shared decision semantics, the case runner.

An engine only answers "which rules match this fact". What that means is decided once, here:
for requests the most restrictive enforced outcome wins (deny > ask > queue > approve) and the
first such rule in file order decides; for sweeps every enforced action applies, de-duplicated.
Rules in `mode: observe` are recorded as "would have" and never act.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rules.catalogue import CATALOGUE, FactType
from rules.decision import Decision, Match
from rules.domain import Subject
from rules.errors import FactError
from rules.policy import Case, Policy, Rule, Verdict, render


class RevisionRetiredError(Exception):
    """The engine's revision was retired by a reload while a caller held it; retry."""


class RuleEngine(Protocol):
    """Answers which of a subject's rules (by position in Policy.rules_for) match a fact."""

    name: str

    def match(self, subject: Subject, facts: Mapping[str, Any]) -> Sequence[int]: ...

    def close(self) -> None: ...


_PYTHON_TYPES: dict[FactType, frozenset[type]] = {
    FactType.NUMBER: frozenset({int, float}),
    FactType.DURATION: frozenset({int, float}),
    FactType.STRING: frozenset({str}),
    FactType.BOOLEAN: frozenset({bool}),
}
# Exact types, so a bool never passes for a number: one set lookup per fact.
_EXPECTED = {
    subject: tuple((name, _PYTHON_TYPES[spec.type]) for name, spec in specs.items())
    for subject, specs in CATALOGUE.items()
}


def check_facts(subject: Subject, facts: Mapping[str, Any]) -> None:
    """Refuse incomplete or mistyped facts: the engines never see a missing or coerced value."""
    expected = _EXPECTED[subject]
    if len(facts) != len(expected):
        _explain_keys(subject, facts)
    try:
        for name, types in expected:
            if type(facts[name]) not in types:
                spec = CATALOGUE[subject][name]
                raise FactError(f"{name} must be a {spec.type}, got {facts[name]!r}")
    except KeyError:
        _explain_keys(subject, facts)


def _explain_keys(subject: Subject, facts: Mapping[str, Any]) -> None:
    catalogue = CATALOGUE[subject]
    missing = sorted(catalogue.keys() - facts.keys())
    extra = sorted(facts.keys() - catalogue.keys())
    raise FactError(f"{subject} facts: missing {missing}, unknown {extra}")


def decide(
    policy: Policy, engine: RuleEngine, subject: Subject, facts: Mapping[str, Any]
) -> Decision:
    """Check the facts, ask the engine which rules match, and apply the decision semantics."""
    check_facts(subject, facts)
    rules = policy.rules_for(subject)
    matched = [rules[i] for i in sorted(engine.match(subject, facts))]
    return _decision(policy, engine.name, subject, facts, matched)


def _decision(
    policy: Policy, engine: str, subject: Subject, facts: Mapping[str, Any], matched: list[Rule]
) -> Decision:
    if not matched and subject != Subject.REQUEST:  # most sweep subjects: nothing to do
        return Decision(subject, policy.revision, engine, dict(facts), (), "default", None)
    matches = tuple(Match(r.id, r.verdict, r.explain(facts), r.observe) for r in matched)
    enforced = [m for m in matches if not m.observe]
    deciding, verdict, because = "default", None, ""
    actions: list[Match] = []
    if subject != Subject.REQUEST:
        seen: set[tuple[Any, Any]] = set()
        for m in enforced:
            key = (m.verdict.action, m.verdict.reason)
            if key not in seen:
                seen.add(key)
                actions.append(m)
        because = "; ".join(m.because for m in actions)
        deciding = actions[0].rule if actions else "default"
    elif not enforced:
        verdict, because = policy.default, render(policy.default_because, facts)
    else:
        winner = max(enforced, key=lambda m: _severity(m.verdict))  # max keeps the first tie
        deciding, verdict, because = winner.rule, winner.verdict, winner.because
    return Decision(
        subject=subject,
        revision=policy.revision,
        engine=engine,
        facts=dict(facts),
        matches=matches,
        deciding=deciding,
        verdict=verdict,
        actions=tuple(actions),
        because=because,
    )


def _severity(verdict: Verdict) -> int:
    return verdict.outcome.severity if verdict.outcome is not None else -1


@dataclass(frozen=True)
class CaseResult:
    case: Case
    passed: bool
    got: tuple[str, ...]
    deciding: str
    message: str = field(default="")

    def __str__(self) -> str:
        where = f"{self.case.file}:{self.case.line}:1"
        return f"{where}: case {self.case.name!r}: {self.message}"


def run_cases(policy: Policy, engine: RuleEngine) -> list[CaseResult]:
    """Evaluate every test case kept next to the rules."""
    results = []
    for case in policy.cases:
        d = decide(policy, engine, case.subject, case.facts)
        if case.subject == Subject.REQUEST:
            got: tuple[str, ...] = (str(d.verdict),)
            expected = case.expect
            ok = _same_outcome(got[0], expected[0])
        else:
            got = tuple(sorted(str(m.verdict) for m in d.actions))
            expected = case.expect
            ok = got == expected
        message = ""
        if not ok:
            message = (
                f"expected {', '.join(expected) or 'nothing'}, got {', '.join(got) or 'nothing'}"
            )
            message += f" (deciding: {d.deciding}; matching: {', '.join(d.matching) or 'none'})"
        elif case.deciding is not None and case.deciding != d.deciding:
            ok = False
            message = f"expected rule {case.deciding!r} to decide, but {d.deciding!r} did"
        results.append(CaseResult(case, ok, got, d.deciding, message))
    return results


def _same_outcome(got: str, expected: str) -> bool:
    """`ask` in a case means `ask managers`, as in a rule's `then`."""
    norm = {"ask": "ask managers"}
    return norm.get(got, got) == norm.get(expected, expected)
