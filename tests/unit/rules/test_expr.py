"""The `when` language: what parses, what it compiles to, and how errors point at the spot."""

from __future__ import annotations

from typing import Any

import pytest

from rules import expr, expr_parser
from rules.catalogue import CATALOGUE
from rules.domain import Subject
from tests.builders import a_request

FACTS = CATALOGUE[Subject.REQUEST]


@pytest.mark.parametrize(
    ("text", "compiled"),
    [
        ("request.gpus > 4", {"$gt": {"request__gpus": 4}}),
        ("4 < request.gpus", {"$gt": {"request__gpus": 4}}),
        ("request.duration <= 1h30m", {"$lte": {"request__duration": 90}}),
        ("request.duration >= 2d", {"$gte": {"request__duration": 2880}}),
        ("request.pool == 'a100'", {"request__pool": "a100"}),
        ('request.pool != "l40s"', {"$neq": {"request__pool": "l40s"}}),
        ("user.is_admin", {"user__is_admin": True}),
        ("not user.is_admin", {"user__is_admin": False}),
        (
            "team.used_after > team.nominal",
            {"$gt": {"team__used_after": {"$m": "team__nominal"}}},
        ),
        (
            "request.pool in ['a100', 'l40s']",
            {"$or": [{"request__pool": "a100"}, {"request__pool": "l40s"}]},
        ),
        (
            "request.gpus not in [1, 2]",
            {"$and": [{"$neq": {"request__gpus": 1}}, {"$neq": {"request__gpus": 2}}]},
        ),
        (
            "not (request.gpus > 4 and user.is_admin)",
            {"$or": [{"$lte": {"request__gpus": 4}}, {"user__is_admin": False}]},
        ),
        (
            "request.gpus > 4 or request.priority == 'high' and not request.has_reason",
            {
                "$or": [
                    {"$gt": {"request__gpus": 4}},
                    {"$and": [{"request__priority": "high"}, {"request__has_reason": False}]},
                ]
            },
        ),
        ("true", {"_eval": 1}),
        ("not true", {"_eval": 0}),
    ],
)
def test_conditions_compile_to_single_fact_durable_expressions(
    text: str, compiled: dict[str, Any]
) -> None:
    """Each construct becomes a durable condition that is safe there (no $in, no $not, no joins)."""
    assert compiled == expr.compile_durable(expr_parser.parse(text, FACTS))


@pytest.mark.parametrize(
    ("text", "message", "offset"),
    [
        ("request.gpu > 3", "unknown fact `request.gpu`", 0),
        ("request.gpus = 3", "use == to compare, not =", 13),
        ("request.duration > 8", "is a duration but is compared with a number", 0),
        ("request.gpus > 8h", "is a number but is compared with a duration", 0),
        ("request.pool < 'x'", "`<` does not apply to strings", 13),
        ("request.gpus", "is a number, not a condition", 0),
        ("(request.gpus > 2", "expected `)`, found the end of the condition", 17),
        ("request.gpus > 2 request.pool", "expected `and`, `or` or the end", 17),
        ("request.gpus in [1, 'a']", "is a number, but this is a string", 20),
        ("3 > 2", "compares two constants", 0),
        ("request.gpus > 2 and", "expected a fact name or a constant", 20),
        ("request.gpus > 2 ; drop", "unexpected character ';'", 17),
        ("__import__('os')", "unknown fact `__import__`", 0),
        ("", "a condition is required", 0),
    ],
)
def test_bad_conditions_say_what_is_wrong_and_where(text: str, message: str, offset: int) -> None:
    """Errors name the problem and the character where it starts."""
    with pytest.raises(expr.ExprError) as caught:
        expr_parser.parse(text, FACTS)
    assert message in str(caught.value)
    assert offset == caught.value.offset


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("request.gpus == 2", True),
        ("request.gpus >= 3", False),
        ("request.duration == 6h", True),
        ("request.duration < 360m", False),
        ("request.pool in ['l40s', 'a100']", True),
        ("request.pool not in ['l40s', 'a100']", False),
        ("not user.is_admin and request.has_reason", True),
        ("user.is_admin or team.used_after > team.nominal", False),
        ("team.used_after <= team.nominal", True),
    ],
)
def test_the_reference_semantics_over_a_request(text: str, expected: bool) -> None:
    """evaluate() reads the facts exactly as an admin reads the condition."""
    assert expected == expr.evaluate(expr_parser.parse(text, FACTS), a_request())


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("90m", 90), ("6h", 360), ("2d", 2880), ("1h30m", 90), ("1w", 10080), ("30s", 0.5)],
)
def test_durations_read_as_minutes(text: str, minutes: float) -> None:
    """Durations are written with a unit and carried as minutes."""
    assert minutes == expr.parse_duration(text)


def test_a_number_without_unit_is_not_a_duration() -> None:
    """Bare numbers are refused where a duration is expected."""
    assert expr.parse_duration("90") is None
