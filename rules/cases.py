"""The test cases kept next to the rules (tests/*.yaml): facts in, outcome expected."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rules import expr, expr_parser
from rules.catalogue import CATALOGUE, FactType
from rules.domain import Subject
from rules.errors import Problem
from rules.policy import Case, Policy, parse_request_then, parse_sweep_then, then_help
from rules.schema import CaseFile, CaseSpec
from rules.yamlsrc import Located


def load_cases(
    docs: list[tuple[Located, CaseFile]],
    policy: Policy,
    problems: list[Problem],
    written_ids: Collection[str] = (),
) -> tuple[Case, ...]:
    """Every case of every file; what is wrong with one is added to `problems`."""
    # A rule that failed to load was reported already; its cases are not an extra problem.
    rule_ids = {r.id for r in policy.rules} | set(written_ids) | {"default"}
    out: list[Case] = []
    for doc, spec in docs:
        _check_defaults(doc, spec, problems)
        for i, case in enumerate(spec.cases):
            out.append(_case(doc, spec, ("cases", i), case, rule_ids=rule_ids, problems=problems))
    return tuple(out)


def _check_defaults(doc: Located, spec: CaseFile, problems: list[Problem]) -> None:
    for subject_name, defaults in spec.defaults.items():
        catalogue = CATALOGUE[Subject(subject_name)]
        for name in defaults:
            if name not in catalogue:
                where = ("defaults", subject_name, name)
                problems.append(doc.at(where, expr_parser.unknown_fact(name, catalogue), key=True))


def _case(
    doc: Located,
    spec: CaseFile,
    at: tuple[str, int],
    case: CaseSpec,
    *,
    rule_ids: Collection[str],
    problems: list[Problem],
) -> Case:
    subject = Subject(case.on)
    facts = _facts(doc, spec, at, case, problems)
    expect = _expect(doc, at, subject, case, problems)
    if case.deciding is not None and case.deciding not in rule_ids:
        problems.append(doc.at((*at, "deciding"), f"no rule has id {case.deciding!r}"))
    return Case(case.name, subject, facts, expect, case.deciding, doc.file, doc.values[at][0])


def _facts(
    doc: Located, spec: CaseFile, at: tuple[str, int], case: CaseSpec, problems: list[Problem]
) -> dict[str, Any]:
    """The case's facts over the file's defaults, converted; the catalogue's defaults fill in."""
    catalogue = CATALOGUE[Subject(case.on)]
    raw = {**spec.defaults.get(case.on, {}), **case.facts}
    facts: dict[str, Any] = {}
    for name, value in raw.items():
        where = (*at, "facts", name) if name in case.facts else ("defaults", case.on, name)
        fact = catalogue.get(name)
        if fact is None:
            problems.append(doc.at(where, expr_parser.unknown_fact(name, catalogue), key=True))
            continue
        converted = _convert(fact.type, value)
        if converted is None:
            problems.append(doc.at(where, f"`{name}` is a {fact.type}, got {value!r}"))
            continue
        facts[name] = converted
    for name, fact in catalogue.items():
        if name not in raw and fact.default is not None:
            facts[name] = fact.default
    missing = sorted(n for n in set(catalogue) - set(raw) if catalogue[n].default is None)
    if missing:
        problems.append(
            doc.at(
                at,
                f"case {case.name!r} lacks facts: {', '.join(missing)} "
                f"(give them in the case or under defaults.{case.on})",
            )
        )
    return facts


def _expect(
    doc: Located, at: tuple[str, int], subject: Subject, case: CaseSpec, problems: list[Problem]
) -> tuple[str, ...]:
    """One outcome for a request case; the sorted actions for a sweep case."""
    expect = (case.expect,) if isinstance(case.expect, str) else tuple(case.expect)
    if subject == Subject.REQUEST:
        if len(expect) != 1 or parse_request_then(expect[0]) is None:
            problems.append(
                doc.at((*at, "expect"), "a request case expects one outcome, e.g. approve")
            )
        return expect
    for j, item in enumerate(expect):
        if parse_sweep_then(item) is None:
            problems.append(doc.at((*at, "expect", j), then_help(subject, item)))
    return tuple(sorted(expect))


def _convert(kind: FactType, value: Any) -> Any:
    if kind == FactType.BOOLEAN:
        return value if isinstance(value, bool) else None
    if kind == FactType.STRING:
        return value if isinstance(value, str) else None
    if kind == FactType.NUMBER:
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if isinstance(value, str):
        return expr.parse_duration(value)
    if value == 0 and not isinstance(value, bool):
        return 0
    return None
