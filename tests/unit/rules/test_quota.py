"""The quota invariant as tables: what no grant may do whatever the rule files say, how it
tightens a decision, and when rule files never state a limit."""

from __future__ import annotations

from typing import Any

import pytest

from rules.domain import Outcome, Subject
from rules.engine import decide
from rules.engine.reference import ReferenceEngine
from rules.loader import load_policy
from rules.policy import Policy, Quota
from rules.quota import QUOTA_RULE, Breach, enforce, exceeds, unstated
from tests.builders import a_request, default_policy, permissive_sources

VISION = Quota(nominal=8, borrowing_limit=4, lending_limit=4)


@pytest.mark.parametrize(
    ("used", "gpus", "lendable", "expected"),
    [
        (0, 8, 0, None),  # inside nominal: lenders do not matter
        (8, 4, 4, None),  # up to the limit, lent in full
        (8, 4, 3, Outcome.QUEUE),  # the lenders have too little now
        (10, 2, 4, None),  # all it borrows, 4, against what is lent to it
        (10, 2, 3, Outcome.QUEUE),
        (10, 3, 4, Outcome.DENY),  # 13 > nominal 8 + borrowing limit 4
        (12, 0, 0, None),  # an extension at the limit
        (13, 0, 9, Outcome.DENY),  # an extension of a team already past it
        (9, 0, 0, None),  # an extension never waits for lenders
    ],
)
def test_what_a_grant_may_take(
    used: int, gpus: int, lendable: int, expected: Outcome | None
) -> None:
    breach = exceeds(
        team="vision", pool="a100", quota=VISION, used=used, gpus=gpus, lendable=lendable
    )
    assert expected == (breach.outcome if breach else None)


def test_a_breach_says_what_the_limit_is() -> None:
    assert Breach(
        Outcome.DENY,
        "team vision would hold 14 GPUs in a100, above its limit of 12 "
        "(nominal 8 + borrowing limit 4)",
    ) == exceeds(team="vision", pool="a100", quota=VISION, used=8, gpus=6, lendable=8)
    assert Breach(
        Outcome.QUEUE,
        "team vision would borrow 3 GPUs in a100, and the other teams lend only 1 GPU now "
        "within their lending limits",
    ) == exceeds(team="vision", pool="a100", quota=VISION, used=8, gpus=3, lendable=1)


def permissive() -> Policy:
    return load_policy(permissive_sources())


def decided(policy: Policy, facts: dict[str, Any]) -> tuple[str, str, Outcome]:
    decision = enforce(decide(policy, ReferenceEngine(policy), Subject.REQUEST, facts))
    assert decision.verdict is not None
    assert decision.verdict.outcome is not None
    return str(decision.verdict), decision.deciding, decision.once_approved()


PAST_LIMIT = {
    "request__gpus": 6,
    "team__used": 8,
    "team__used_after": 14,
    "team__borrowed_after": 6,
}
SHORT_OF_LENDERS = {
    "request__gpus": 4,
    "team__used": 8,
    "team__used_after": 12,
    "team__borrowed_after": 4,
    "pool__lendable": 2,
}
EXTEND_PAST_LIMIT = {
    "request__kind": "extend",
    "request__duration": 120.0,
    "team__used": 14,
    "team__used_after": 14,
    "team__borrowed_after": 6,
    "lease__extended_after": 120.0,
}


@pytest.mark.parametrize(
    ("rules", "facts", "expected"),
    [
        # The shipped rules already say it: they decide, the invariant adds nothing.
        ("shipped", PAST_LIMIT, ("deny", "beyond-borrowing-limit", Outcome.DENY)),
        ("shipped", SHORT_OF_LENDERS, ("ask managers", "borrowing-needs-a-manager", Outcome.QUEUE)),
        ("shipped", {}, ("approve", "within-nominal", Outcome.APPROVE)),
        # Without the quota rules the code holds the line.
        ("permissive", PAST_LIMIT, ("deny", QUOTA_RULE, Outcome.DENY)),
        # A person is still asked; once they approve, the borrow waits for the lenders.
        (
            "permissive",
            SHORT_OF_LENDERS,
            ("ask managers", "borrowing-needs-a-manager", Outcome.QUEUE),
        ),
        ("permissive", {}, ("approve", "within-nominal", Outcome.APPROVE)),
        ("permissive", EXTEND_PAST_LIMIT, ("deny", QUOTA_RULE, Outcome.DENY)),
    ],
)
def test_the_invariant_tightens_a_decision_the_rules_left_looser(
    rules: str, facts: dict[str, Any], expected: tuple[str, str, Outcome]
) -> None:
    policy = default_policy() if rules == "shipped" else permissive()
    assert expected == decided(policy, a_request(**facts))


def test_a_borrow_approved_by_the_rules_waits_when_lenders_have_too_little() -> None:
    """No manager rule and a default of approve: the invariant's `queue` decides."""
    sources = permissive_sources()
    text = sources["requests.yaml"].replace("default:\n  then: ask", "default:\n  then: approve")
    sources["requests.yaml"] = text.replace("team.borrowed_after > 0", "team.borrowed_after > 100")
    policy = load_policy({k: v for k, v in sources.items() if not k.startswith("tests/")})
    verdict, deciding, _ = decided(policy, a_request(**SHORT_OF_LENDERS))
    assert ("queue", QUOTA_RULE) == (verdict, deciding)


def test_rules_check_warnings_name_each_limit_the_rules_never_look_at() -> None:
    assert [] == unstated(default_policy())
    warnings = unstated(permissive())
    assert 2 == len(warnings)
    assert warnings[0].startswith(
        "no request rule looks at the borrowing limit (nominal + borrowing_limit) "
        "(`team.borrowing_limit`, `team.limit`)"
    )
    assert "(`pool.lendable`, `team.lending_limit`)" in warnings[1]
