"""Decision semantics shared by both engines: most restrictive wins, sweeps de-duplicate,
observe mode records without acting, and the cases next to the rules pass."""

from __future__ import annotations

import pytest

from rules.domain import Action, Outcome, Reason, Subject
from rules.engine import decide, run_cases
from rules.engine.live import EngineName, build_engine
from rules.errors import FactError
from rules.loader import load_policy
from tests.builders import a_gpu, a_lease, a_request, default_policy, default_sources

ENGINES: list[EngineName] = ["durable", "reference"]


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> EngineName:
    name: EngineName = request.param
    return name


@pytest.mark.parametrize(
    ("facts", "outcome", "deciding"),
    [
        (a_request(), Outcome.APPROVE, "within-nominal"),
        (
            a_request(request__gpus=4, team__used_after=10, team__borrowed_after=2),
            Outcome.ASK,
            "borrowing-needs-a-manager",
        ),
        (
            # matches within-nominal (approve), long-borrow (ask) and too-long (deny): deny wins
            a_request(request__duration=5 * 24 * 60),
            Outcome.DENY,
            "too-long",
        ),
        (a_request(pool__free=1), Outcome.QUEUE, "not-enough-free"),
    ],
)
def test_the_most_restrictive_matching_rule_decides(
    engine_name: EngineName, facts: dict[str, object], outcome: Outcome, deciding: str
) -> None:
    """deny > ask > queue > approve, and the decision names the deciding rule."""
    policy = default_policy()
    decision = decide(policy, build_engine(policy, engine_name), Subject.REQUEST, facts)
    assert decision.verdict is not None
    assert (outcome, deciding) == (decision.verdict.outcome, decision.deciding)
    assert deciding in decision.matching
    assert engine_name == decision.engine
    assert policy.revision == decision.revision


def test_the_decision_lists_every_matching_rule_and_fills_because(
    engine_name: EngineName,
) -> None:
    """All matching rules are listed in file order; because texts carry the fact values."""
    policy = default_policy()
    facts = a_request(request__duration=5 * 24 * 60)
    decision = decide(policy, build_engine(policy, engine_name), Subject.REQUEST, facts)
    assert ["too-long", "long-borrow-needs-a-manager", "within-nominal"] == decision.matching
    assert "5d is longer than a borrow may last in a100 (3d)" == decision.because


def test_no_matching_rule_gives_the_default_with_its_because(engine_name: EngineName) -> None:
    """Nothing matches: the policy's default outcome applies and says so."""
    policy = default_policy()
    facts = a_request(request__kind="extend", request__duration=120.0, lease__extended_after=120.0)
    facts["team.used_after"] = 2
    sources = default_sources()
    sources["requests.yaml"] = sources["requests.yaml"].replace(
        "when: request.kind == 'extend'\n", "when: request.kind == 'extend' and user.is_admin\n"
    )
    sources = {k: v for k, v in sources.items() if not k.startswith("tests/")}
    policy = load_policy(sources)
    decision = decide(policy, build_engine(policy, engine_name), Subject.REQUEST, facts)
    assert decision.verdict is not None
    assert Outcome.ASK == decision.verdict.outcome
    assert "default" == decision.deciding
    assert [] == decision.matching
    assert "no rule approved this at once, so a manager of vision decides" == decision.because


def test_observe_mode_records_what_it_would_have_done_without_acting(
    engine_name: EngineName,
) -> None:
    """An observed rule matches and is recorded, but the outcome ignores it."""
    policy = default_policy()
    facts = a_request(request__gpus=4, request__has_reason=False, team__used_after=6)
    decision = decide(policy, build_engine(policy, engine_name), Subject.REQUEST, facts)
    assert decision.verdict is not None
    assert Outcome.APPROVE == decision.verdict.outcome
    assert ["big-request-without-reason"] == [m.rule for m in decision.would_have]


def test_sweep_actions_all_apply_once_each(engine_name: EngineName) -> None:
    """Every matching sweep rule acts; two rules asking the same action yield it once."""
    sources = default_sources()
    sources["sweep.yaml"] += (
        "\n  - id: warn-expiry-again\n    on: lease\n    when: lease.time_left < 1h\n"
        "    then: warn expiry\n"
    )
    policy = load_policy(sources)
    facts = a_lease(lease__time_left=50.0, lease__expiry_warning_due=True, lease__unhealthy=True)
    decision = decide(policy, build_engine(policy, engine_name), Subject.LEASE, facts)
    assert ["warn-before-expiry", "unhealthy-lease", "warn-expiry-again"] == decision.matching
    assert [(Action.WARN, Reason.EXPIRY), (Action.WARN, Reason.UNHEALTHY)] == [
        (m.verdict.action, m.verdict.reason) for m in decision.actions
    ]


def test_each_sweep_action_is_its_own_decision(engine_name: EngineName) -> None:
    """Per action: the rule that asked for it decides, its reason explains, and the matching
    rules are those that asked for the same action."""
    sources = default_sources()
    sources["sweep.yaml"] += (
        "\n  - id: warn-expiry-again\n    on: lease\n    when: lease.time_left < 1h\n"
        "    then: warn expiry\n    because: also {lease.time_left} left\n"
    )
    policy = load_policy(sources)
    facts = a_lease(lease__time_left=50.0, lease__expiry_warning_due=True, lease__unhealthy=True)
    decision = decide(policy, build_engine(policy, engine_name), Subject.LEASE, facts)
    expiry, unhealthy = (decision.for_action(m) for m in decision.actions)
    assert ("warn-before-expiry", "unhealthy-lease") == (expiry.deciding, unhealthy.deciding)
    assert ["warn-before-expiry", "warn-expiry-again"] == expiry.matching
    assert ["unhealthy-lease"] == unhealthy.matching
    assert "lease 7 ends in 50m" == expiry.because
    assert "a GPU of lease 7 reports a hardware fault" == unhealthy.because
    assert (decision.actions[1],) == unhealthy.actions
    assert decision.facts == unhealthy.facts


def test_gpu_rules_see_gpu_facts(engine_name: EngineName) -> None:
    """GPU subjects have their own rules and catalogue."""
    policy = default_policy()
    facts = a_gpu(gpu__healthy=False, gpu__health="ecc")
    decision = decide(policy, build_engine(policy, engine_name), Subject.GPU, facts)
    assert ["unhealthy-gpu"] == decision.matching
    assert "a100-node-01 GPU 3 reports ecc" == decision.because


def test_the_shipped_cases_pass_on_both_engines(engine_name: EngineName) -> None:
    """The test cases next to the rules hold for the shipped policy."""
    policy = default_policy()
    results = run_cases(policy, build_engine(policy, engine_name))
    assert [] == [str(r) for r in results if not r.passed]
    assert len(policy.cases) == len(results) > 20


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"request.gpus": "2"}, "request.gpus must be a number, got '2'"),
        ({"user.is_admin": 1}, "user.is_admin must be a boolean, got 1"),
        ({"request.gpus": True}, "request.gpus must be a number, got True"),
    ],
)
def test_mistyped_facts_are_refused_before_any_engine_sees_them(
    change: dict[str, object], message: str
) -> None:
    """durable would coerce "2" > 1 and true == 1; the facts check refuses both."""
    policy = default_policy()
    with pytest.raises(FactError, match=message):
        decide(policy, build_engine(policy), Subject.REQUEST, {**a_request(), **change})


def test_missing_facts_are_refused() -> None:
    """A fact without one of its names is a bug, reported by name."""
    policy = default_policy()
    facts = a_request()
    del facts["pool.free"]
    with pytest.raises(FactError, match=r"missing \['pool.free'\]"):
        decide(policy, build_engine(policy), Subject.REQUEST, facts)
