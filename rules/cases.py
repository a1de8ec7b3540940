"""The test cases kept next to the rules (tests/*.yaml): facts in, outcome expected."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rules import expr, expr_parser
from rules.catalogue import CATALOGUE, FactType
from rules.domain import Subject
from rules.errors import Problem
from rules.policy import Case, Policy, parse_request_then, parse_sweep_then, then_help
from rules.schema import CaseFile
from rules.yamlsrc import Located


def load_cases(
    docs: list[tuple[Located, CaseFile]],
    policy: Policy,
    problems: list[Problem],
    written_ids: Collection[str] = (),
) -> tuple[Case, ...]:
    out: list[Case] = []
    # A rule that failed to load was reported already; its cases are not an extra problem.
    rule_ids = {r.id for r in policy.rules} | set(written_ids)
    for doc, spec in docs:
        for subject_name, defaults in spec.defaults.items():
            subject = Subject(subject_name)
            for name in defaults:
                if name not in CATALOGUE[subject]:
                    problems.append(
                        doc.at(
                            ("defaults", subject_name, name),
                            expr_parser.unknown_fact(name, CATALOGUE[subject]),
                            key=True,
                        )
                    )
        for i, c in enumerate(spec.cases):
            at = ("cases", i)
            subject = Subject(c.on)
            catalogue = CATALOGUE[subject]
            raw = {**spec.defaults.get(c.on, {}), **c.facts}
            facts: dict[str, Any] = {}
            for name, value in raw.items():
                where = (*at, "facts", name) if name in c.facts else ("defaults", c.on, name)
                fact = catalogue.get(name)
                if fact is None:
                    problems.append(
                        doc.at(where, expr_parser.unknown_fact(name, catalogue), key=True)
                    )
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
                        f"case {c.name!r} lacks facts: {', '.join(missing)} "
                        f"(give them in the case or under defaults.{c.on})",
                    )
                )
            expect = (c.expect,) if isinstance(c.expect, str) else tuple(c.expect)
            if subject == Subject.REQUEST:
                if len(expect) != 1 or parse_request_then(expect[0]) is None:
                    problems.append(
                        doc.at((*at, "expect"), "a request case expects one outcome, e.g. approve")
                    )
            else:
                for j, item in enumerate(expect):
                    if parse_sweep_then(item) is None:
                        problems.append(doc.at((*at, "expect", j), then_help(subject, item)))
                expect = tuple(sorted(expect))
            if c.deciding is not None and c.deciding not in rule_ids | {"default"}:
                problems.append(doc.at((*at, "deciding"), f"no rule has id {c.deciding!r}"))
            out.append(
                Case(c.name, subject, facts, expect, c.deciding, doc.file, doc.values[at][0])
            )
    return tuple(out)


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
