"""The sweep's memo (rules.memo) gives exactly the decisions the engine gives: on random facts
that share the values their conditions read, with each subject's own facts and reasons; and a
memo never outlives its pass or its revision."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rules.domain import Subject
from rules.engine import RevisionRetiredError, RuleEngine, decide
from rules.engine.durable import DurableEngine
from rules.engine.live import LivePolicy
from rules.engine.reference import ReferenceEngine
from rules.errors import FactError
from rules.memo import MemoEngine, PassDecisions, facts_read
from rules.policy import Policy
from tests.builders import a_gpu, a_lease, default_policy, default_sources
from tests.unit.rules.test_differential import facts_for

POLICY = default_policy()
DURABLE = DurableEngine(POLICY)
REFERENCE = ReferenceEngine(POLICY)
SUBJECTS = [Subject.LEASE, Subject.GPU, Subject.REQUEST]


@st.composite
def a_pass(draw: st.DrawFn, subject: Subject) -> list[dict[str, Any]]:
    """Facts of one pass: some drawn afresh, others sharing what the conditions read with an
    earlier subject (with 1 and 1.0 swapped where a number may be either)."""
    read = facts_read(POLICY, subject)
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(2, 12))):
        fresh = draw(facts_for(subject))
        if draw(st.booleans()) and out:
            twin = draw(st.sampled_from(out))
            fresh.update({n: twin[n] for n in read})
            if draw(st.booleans()):  # the same number, as the other numeric type
                name = draw(st.sampled_from(read))
                if type(fresh[name]) is int:
                    fresh[name] = float(fresh[name])
                elif type(fresh[name]) is float and fresh[name].is_integer():
                    fresh[name] = int(fresh[name])
        out.append(fresh)
    return out


@pytest.mark.parametrize("engine", [DURABLE, REFERENCE], ids=["durable", "reference"])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subject=st.sampled_from(SUBJECTS), data=st.data())
def test_the_memo_decides_exactly_as_the_engine(
    engine: RuleEngine, subject: Subject, data: st.DataObject
) -> None:
    """Every decision equal to the engine's: rules matched, deciding rule, reasons rendered from
    the subject's own facts, the facts the audit records, the revision."""
    decisions = PassDecisions(lambda: (POLICY, engine))
    for facts in data.draw(a_pass(subject)):
        assert decide(POLICY, engine, subject, facts) == decisions.decide(subject, facts)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subject=st.sampled_from([Subject.LEASE, Subject.GPU]), data=st.data())
def test_a_sweep_subject_is_acted_on_exactly_where_a_rule_matched(
    subject: Subject, data: st.DataObject
) -> None:
    """`acted_on` gives the engine's decision where any rule matched, and None where none did
    (the sweep then has nothing to do with the subject)."""
    decisions = PassDecisions(lambda: (POLICY, REFERENCE))
    subjects = data.draw(a_pass(subject))
    for facts in subjects:
        expected = decide(POLICY, REFERENCE, subject, facts)
        assert (expected if expected.matches else None) == decisions.acted_on(subject, facts)
    assert len(subjects) == decisions.asked + decisions.answered


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subject=st.sampled_from([Subject.LEASE, Subject.GPU]), data=st.data())
def test_the_rules_matched_make_the_decision_acted_on(
    subject: Subject, data: st.DataObject
) -> None:
    """`matched` finds rules where `acted_on` decides, and `decision` makes its Decision."""
    decisions = PassDecisions(lambda: (POLICY, REFERENCE))
    for facts in data.draw(a_pass(subject)):
        matched = decisions.matched(subject, facts)
        expected = decisions.acted_on(subject, facts)
        assert (matched is None) == (expected is None)
        if matched is not None:
            assert expected == decisions.decision(subject, facts, matched)


def test_a_gpu_no_rule_matches_is_not_acted_on_and_a_faulty_one_is() -> None:
    decisions = PassDecisions(lambda: (POLICY, REFERENCE))
    assert decisions.acted_on(Subject.GPU, a_gpu()) is None
    faulty = decisions.acted_on(Subject.GPU, a_gpu(gpu__healthy=False, gpu__health="xid"))
    assert faulty is not None
    assert faulty.actions


def test_subjects_that_read_alike_are_evaluated_once_and_keep_their_own_facts() -> None:
    decisions = PassDecisions(lambda: (POLICY, DURABLE))
    gpus = [a_gpu(gpu__node=f"node-{k}", gpu__index=k % 8) for k in range(50)]
    made = [decisions.decide(Subject.GPU, facts) for facts in gpus]
    assert (1, 49) == (decisions.asked, decisions.answered)
    assert [f["gpu.node"] for f in gpus] == [d.facts["gpu.node"] for d in made]


def test_one_value_of_another_type_is_evaluated_on_its_own() -> None:
    """1 == 1.0 in Python; the memo leaves it to the engine whether they mean the same."""
    name = next(n for n in facts_read(POLICY, Subject.LEASE) if type(a_lease()[n]) is float)
    as_float = a_lease(**{name: 1.0})
    as_int = a_lease(**{name: 1})
    memo = MemoEngine(POLICY, DURABLE)
    memo.match(Subject.LEASE, as_float)
    memo.match(Subject.LEASE, as_int)
    assert (2, 0) == (memo.asked, memo.answered)


def test_wrong_facts_are_refused_before_the_memo_answers() -> None:
    decisions = PassDecisions(lambda: (POLICY, DURABLE))
    decisions.decide(Subject.GPU, a_gpu())
    with pytest.raises(FactError):
        decisions.decide(Subject.GPU, {**a_gpu(), "gpu.index": "0"})


def test_acted_on_answers_from_the_memo_across_subjects_and_refuses_wrong_facts() -> None:
    """A sweep decides leases, then GPUs, then (after a recall) leases again: each subject's
    memo answers its own, and facts the memo has not seen checked are refused."""
    decisions = PassDecisions(lambda: (POLICY, DURABLE))
    faulty = a_gpu(gpu__healthy=False, gpu__health="xid")
    for subject, facts in [(Subject.LEASE, a_lease()), (Subject.GPU, faulty)] * 2:
        expected = decide(POLICY, DURABLE, subject, facts)
        assert (expected if expected.matches else None) == decisions.acted_on(subject, facts)
    assert (2, 2) == (decisions.asked, decisions.answered)
    with pytest.raises(FactError):
        decisions.acted_on(Subject.GPU, {**faulty, "gpu.index": "0"})
    with pytest.raises(FactError):
        decisions.acted_on(Subject.GPU, {k: v for k, v in faulty.items() if k != "gpu.index"})


def test_a_reload_within_a_pass_is_decided_by_the_new_revision() -> None:
    """The memo of the old revision answers nothing once the new one is in force."""
    live = LivePolicy(default_sources(), "reference")
    try:
        decisions = PassDecisions(live.current)
        lease = a_lease()
        before = decisions.decide(Subject.LEASE, lease)
        sources = default_sources()
        live.reload({**sources, "org.yaml": sources["org.yaml"] + "\n# edited\n"})
        after = decisions.decide(Subject.LEASE, lease)
        assert before.revision != after.revision
        assert live.policy.revision == after.revision
        assert (2, 0) == (decisions.asked, decisions.answered)
    finally:
        live.close()


def test_a_revision_retired_under_the_pass_is_asked_again() -> None:
    """An engine closed by a reload raises RevisionRetiredError; the pass then reads the
    revision in force anew."""
    old, new = _engine(POLICY, retired=True), ReferenceEngine(POLICY)
    current = iter([(POLICY, old), (POLICY, new)])
    decisions = PassDecisions(lambda: next(current))
    assert decide(POLICY, new, Subject.GPU, a_gpu()) == decisions.decide(Subject.GPU, a_gpu())


def _engine(policy: Policy, *, retired: bool) -> RuleEngine:
    class Retired(ReferenceEngine):
        def match(self, subject: Subject, facts: Any) -> list[int]:
            raise RevisionRetiredError(policy.revision)

    return Retired(policy) if retired else ReferenceEngine(policy)


def test_facts_in_another_order_or_of_another_type_are_checked_and_decided_alike() -> None:
    """The memo knows facts by their names in order and each value's type: the same facts in
    another order are decided alike, and a value of a wrong type is refused in any order."""
    decisions = PassDecisions(lambda: (POLICY, REFERENCE))
    faulty = a_gpu(gpu__healthy=False, gpu__health="xid")
    backwards = dict(reversed(list(faulty.items())))
    first = decisions.acted_on(Subject.GPU, faulty)
    assert first is not None
    assert first == decisions.acted_on(Subject.GPU, backwards)
    assert first == decisions.acted_on(Subject.GPU, faulty)
    with pytest.raises(FactError):
        decisions.acted_on(Subject.GPU, {**backwards, "gpu.healthy": 0})
    with pytest.raises(FactError):
        decisions.acted_on(Subject.GPU, {**faulty, "gpu.healthy": 0})
    assert (1, 2) == (decisions.asked, decisions.answered)
