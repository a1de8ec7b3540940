"""The borrow and deny forms: their ids, and how their submissions are read back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.slack import blocks as kit
from bot.slack.parse import Borrow
from rules.domain import Priority
from tests.unit.slack.builders import T0


def test_borrow_modal_names_its_inputs() -> None:
    view = kit.borrow_modal(["l40s", "a100"], "a100", T0)
    assert "borrow_modal" == view["callback_id"]
    inputs = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    assert [
        "borrow_pool",
        "borrow_count",
        "borrow_duration",
        "borrow_priority",
        "borrow_reason",
    ] == list(inputs)
    assert "a100" == inputs["borrow_pool"]["initial_option"]["value"]
    assert "number_input" == inputs["borrow_count"]["type"]
    assert inputs["borrow_reason"]["multiline"]


def test_deny_modal_keeps_the_request_id() -> None:
    view = kit.deny_modal(12)
    assert ("deny_modal", "12") == (view["callback_id"], view["private_metadata"])
    assert view["blocks"][0]["optional"]


def _state(pool: str, count: str, duration: str, priority: str = "high") -> dict[str, Any]:
    return {
        "borrow_pool": {"pool": {"selected_option": {"value": pool}}},
        "borrow_count": {"count": {"value": count}},
        "borrow_duration": {"duration": {"value": duration}},
        "borrow_priority": {"priority": {"selected_option": {"value": priority}}},
        "borrow_reason": {"reason": {"value": "Ablations"}},
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            _state("a100", "2", "6h"),
            Borrow("a100", 2, timedelta(hours=6), Priority.HIGH, "Ablations"),
        ),
        (
            _state("a100", "2", ""),
            Borrow("a100", 2, None, Priority.HIGH, "Ablations"),
        ),
        (
            _state("a100", "1", "until 18:00", "low"),
            Borrow("a100", 1, timedelta(hours=8), Priority.LOW, "Ablations"),
        ),
        (_state("h100", "2", "6h"), {"borrow_pool": "Pick one of the pools."}),
        (_state("a100", "0", "6h"), {"borrow_count": "Ask for at least one GPU."}),
        (
            _state("a100", "2", "3"),
            {"borrow_duration": "Say only how long: 6h, 2d, or until fri 18:00."},
        ),
        (_state("a100", "2", "soon"), {"borrow_duration": "I did not understand `soon`."}),
    ],
)
def test_borrow_form_submission_reads_as_a_borrow_or_errors(
    values: dict[str, Any], expected: object
) -> None:
    """A good form is a Borrow; a bad field gets an error under its own block."""
    got = kit.borrow_from_modal(
        values, now=T0, tz=ZoneInfo("Europe/Berlin"), pools=["a100", "l40s"]
    )
    assert expected == got


def test_deny_reason_is_read_from_the_form() -> None:
    assert "over quota" == kit.deny_reason_from_modal(
        {"deny_reason": {"reason": {"value": " over quota "}}}
    )
    assert "" == kit.deny_reason_from_modal({})
