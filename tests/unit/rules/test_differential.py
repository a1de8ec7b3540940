"""The durable engine and the pure-Python reference agree: on the shipped policy over thousands
of random facts, and on random conditions built from the whole language."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rules.catalogue import CATALOGUE, FactType
from rules.domain import Subject
from rules.engine.durable import DurableEngine
from rules.engine.reference import ReferenceEngine
from rules.loader import load_policy
from tests.builders import default_policy, default_sources

STRINGS = [
    "a100",
    "l40s",
    "inference",
    "vision",
    "nlp",
    "platform",
    "borrow",
    "extend",
    "low",
    "normal",
    "high",
    "ok",
    "xid",
    "U0ALICE01",
    "a100-node-01",
]
NUMBERS = [-1, 0, 1, 2, 3, 4, 6, 8, 9, 12, 16, 0.5, 7.25]
MINUTES = [0, 10, 30, 59.5, 60, 90, 360, 1440, 4320, 10080]


def value_of(kind: FactType) -> st.SearchStrategy[Any]:
    if kind == FactType.BOOLEAN:
        return st.booleans()
    if kind == FactType.STRING:
        return st.sampled_from(STRINGS)
    if kind == FactType.DURATION:
        return st.sampled_from(MINUTES) | st.integers(0, 20000)
    return st.sampled_from(NUMBERS) | st.integers(-5, 40)


@functools.cache  # built and validated once: building one per example took most of its time
def facts_for(subject: Subject) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {name: value_of(spec.type) for name, spec in CATALOGUE[subject].items()}
    )


DEFAULT = default_policy()
DURABLE = DurableEngine(DEFAULT)
REFERENCE = ReferenceEngine(DEFAULT)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subject=st.sampled_from(list(Subject)), data=st.data())
def test_both_engines_agree_on_the_shipped_policy(subject: Subject, data: st.DataObject) -> None:
    """For any facts, durable and the reference match exactly the same rules."""
    facts = data.draw(facts_for(subject))
    assert list(REFERENCE.match(subject, facts)) == list(DURABLE.match(subject, facts))


# ---- random conditions ------------------------------------------------------------------

REQUEST = CATALOGUE[Subject.REQUEST]
BY_TYPE = {kind: [n for n, s in REQUEST.items() if s.type == kind] for kind in FactType}


@functools.cache
def literal(kind: FactType, fact: str = "") -> st.SearchStrategy[str]:
    if kind == FactType.STRING:
        if fact.endswith(".pool"):  # the loader refuses pool and team names nobody defined
            return st.sampled_from(["'a100'", "'l40s'", "'inference'"])
        if fact.endswith(".team"):
            return st.sampled_from(["'vision'", "'nlp'"])
        return st.sampled_from(["'a100'", "'borrow'", "'high'", "'vision'", "'x y'"])
    if kind == FactType.DURATION:
        return st.sampled_from(["0m", "30m", "90m", "6h", "1d", "3d", "1h30m"])
    if kind == FactType.BOOLEAN:
        return st.sampled_from(["true", "false"])
    return st.sampled_from(["0", "1", "2", "4", "8", "12", "2.5", "-1"])


@st.composite
def comparison(draw: st.DrawFn) -> str:
    kind = draw(
        st.sampled_from([FactType.NUMBER, FactType.DURATION, FactType.STRING, FactType.BOOLEAN])
    )
    fact = draw(st.sampled_from(BY_TYPE[kind]))
    ordered = kind in (FactType.NUMBER, FactType.DURATION)
    form = draw(
        st.sampled_from(
            ["cmp", "fact", "in", "bare"] if kind != FactType.BOOLEAN else ["cmp", "bare"]
        )
    )
    if form == "bare" and kind == FactType.BOOLEAN:
        return fact
    if form == "in" and kind != FactType.BOOLEAN:
        items = draw(st.lists(literal(kind, fact), min_size=1, max_size=3))
        neg = draw(st.sampled_from(["", "not "]))
        return f"{fact} {neg}in [{', '.join(items)}]"
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="] if ordered else ["==", "!="]))
    if form == "fact":
        other = draw(st.sampled_from(BY_TYPE[kind]))
        return f"{fact} {op} {other}"
    right = draw(literal(kind, fact))
    return draw(st.sampled_from([f"{fact} {op} {right}", f"{right} {op} {fact}"]))


conditions = st.recursive(
    comparison(),
    lambda inner: st.one_of(
        st.builds(lambda a: f"not ({a})", inner),
        st.builds(lambda a, b: f"({a}) and ({b})", inner, inner),
        st.builds(lambda a, b: f"{a} or {b}", inner, inner),
    ),
    max_leaves=6,
)

BASE = {
    k: v for k, v in default_sources().items() if k in ("org.yaml", "pools.yaml", "limits.yaml")
}


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(whens=st.lists(conditions, min_size=1, max_size=6), data=st.data())
def test_both_engines_agree_on_random_conditions(whens: list[str], data: st.DataObject) -> None:
    """Negation push-down, `in`, fact-to-fact comparisons: the compiled form means the same."""
    rules = "rules:\n" + "".join(
        f'  - id: r{i}\n    on: request\n    when: "{w}"\n    then: approve\n'
        for i, w in enumerate(whens)
    )
    policy = load_policy({**BASE, "rules.yaml": rules})
    durable, reference = DurableEngine(policy), ReferenceEngine(policy)
    try:
        for facts in data.draw(st.lists(facts_for(Subject.REQUEST), min_size=20, max_size=20)):
            assert list(reference.match(Subject.REQUEST, facts)) == list(
                durable.match(Subject.REQUEST, facts)
            )
    finally:
        durable.close()
