"""The borrow and deny forms: their ids, and how their submissions are read back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.slack import blocks as kit
from bot.slack.parse import Borrow
from rules.domain import Priority
from tests.builders import default_policy
from tests.unit.slack.builders import T0

ALICE = "U0ALICE01"  # vision: quota in a100 and l40s


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


def test_deny_modal_keeps_the_request_id_and_requires_a_reason() -> None:
    view = kit.deny_modal(12)
    assert ("deny_modal", "12") == (view["callback_id"], view["private_metadata"])
    assert not view["blocks"][0]["optional"]
    assert 500 == view["blocks"][0]["element"]["max_length"]


def test_the_count_is_whole_and_bounded_and_the_reason_required() -> None:
    """Slack's own checks are there too; the server checks the submission whatever a client
    does (borrow_from_modal)."""
    view = kit.borrow_modal(["a100", "l40s"], "a100", T0, most_gpus=8)
    inputs = {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}
    count = inputs["borrow_count"]["element"]
    assert (False, "1", "8") == (
        count["is_decimal_allowed"],
        count["min_value"],
        count["max_value"],
    )
    assert not inputs["borrow_reason"]["optional"]
    assert 500 == inputs["borrow_reason"]["element"]["max_length"]
    assert ["a100", "l40s"] == [o["value"] for o in inputs["borrow_pool"]["element"]["options"]]


def _state(
    pool: str, count: str, duration: str, priority: str = "high", reason: str = "Ablations"
) -> dict[str, Any]:
    return {
        "borrow_pool": {"pool": {"selected_option": {"value": pool}}},
        "borrow_count": {"count": {"value": count}},
        "borrow_duration": {"duration": {"value": duration}},
        "borrow_priority": {"priority": {"selected_option": {"value": priority}}},
        "borrow_reason": {"reason": {"value": reason}},
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
        (
            _state("h100", "2", "6h"),
            {"borrow_pool": "Team vision has no quota in h100. Its pools: a100, l40s."},
        ),
        (_state("a100", "0", "6h"), {"borrow_count": "Ask for at least one GPU."}),
        (_state("a100", "", "6h"), {"borrow_count": "Say how many GPUs you need, for example 2."}),
        (_state("a100", "1.5", "6h"), {"borrow_count": "Whole GPUs only: 1, 2, 3 and so on."}),
        (
            _state("a100", "two", "6h"),
            {"borrow_count": "Type a whole number of GPUs, for example 2."},
        ),
        (
            _state("a100", "100", "6h"),
            {"borrow_count": "One request of team vision in a100 may take at most 8 GPUs."},
        ),
        (
            _state("a100", "2", "3"),
            {"borrow_duration": "Say only how long: 6h, 2d, or until fri 18:00."},
        ),
        (_state("a100", "2", "soon"), {"borrow_duration": "I did not understand `soon`."}),
        (
            _state("a100", "2", "99d"),
            {"borrow_duration": "A borrow in a100 lasts at most 3d; ask for less."},
        ),
        (
            _state("a100", "2", "6h", reason=""),
            {
                "borrow_reason": "Say in a few words what the GPUs are for: your manager may "
                "read it."
            },
        ),
        (
            _state("inference", "", "99d", reason=""),
            {
                "borrow_pool": "Team vision has no quota in inference. Its pools: a100, l40s.",
                "borrow_count": "Say how many GPUs you need, for example 2.",
                "borrow_duration": "A borrow in inference lasts at most 30d; ask for less.",
                "borrow_reason": "Say in a few words what the GPUs are for: your manager may "
                "read it.",
            },
        ),
    ],
)
def test_borrow_form_submission_reads_as_a_borrow_or_errors(
    values: dict[str, Any], expected: object
) -> None:
    """A good form is a Borrow; each bad field gets an error under its own block, all at once."""
    got = kit.borrow_from_modal(
        values, now=T0, tz=ZoneInfo("Europe/Berlin"), policy=default_policy(), user=ALICE
    )
    assert expected == got


def test_deny_reason_is_read_from_the_form() -> None:
    assert "over quota" == kit.deny_reason_from_modal(
        {"deny_reason": {"reason": {"value": " over quota "}}}
    )
    assert "" == kit.deny_reason_from_modal({})
