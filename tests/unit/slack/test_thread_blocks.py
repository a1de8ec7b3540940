"""The grant DM as its thread's parent, warnings that say their reason once, the admin digest."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from bot.slack.blocks.leases import grant_message, grant_status
from bot.slack.blocks.warnings import admin_digest, warning_message
from tests.unit.slack.builders import T0, a_lease, validate_blocks


def _said(built: object) -> str:
    return str(getattr(built, "text", "")) + json.dumps(getattr(built, "blocks", []))


@pytest.mark.parametrize(
    ("overrides", "warned", "expected"),
    [
        ({}, (), ""),
        ({}, ("expiry",), "a warning that it ends soon sent"),
        ({"extensions": 1, "extended": timedelta(hours=2)}, (), "extended once by 2h"),
        ({"recalled_for": "nlp (R4)"}, ("preempt",), "recall pending · a recall notice sent"),
        ({"extensions": 3, "extended": timedelta(hours=6)}, (), "extended 3 times by 6h"),
    ],
)
def test_the_grant_s_status_says_what_happened_since(
    overrides: dict[str, object], warned: tuple[str, ...], expected: str
) -> None:
    """Nothing when nothing happened; otherwise the end, then what moved it or stands on it."""
    status = grant_status(a_lease(**overrides), warned)
    assert expected in status
    assert status.startswith("Ends <!date^") if expected else status == ""


def test_a_warned_grant_is_drawn_with_its_status_and_its_buttons() -> None:
    built = grant_message(a_lease(), (), ("idle",))
    validate_blocks(built.blocks)
    assert "a warning that its GPUs look idle sent (the thread has the details)" in _said(built)
    assert "lease_extend" in _said(built)


@pytest.mark.parametrize("reason", ["expiry", "idle", "unhealthy"])
def test_a_warning_says_its_reason_once(reason: str) -> None:
    """The rule's `because` is not repeated under the bot's own line, nor in the fallback."""
    built = warning_message(
        a_lease(),
        reason,
        "lease 7 ends in 59m",
        grace=timedelta(minutes=30),
        now=T0,
        time_left_min=59,
        idle_for_min=95,
        snoozes_left=2,
    )
    validate_blocks(built.blocks)
    assert "lease 7 ends in 59m" not in _said(built)
    assert "<!date" not in built.text
    assert "*" not in built.text


def test_the_admin_digest_lists_every_line_and_counts_processes_right() -> None:
    lines = ["1 processes run on n1 GPU 0 without a lease", "11 processes run on n2 GPU 1", "x"]
    built = admin_digest(lines, earlier=2)
    validate_blocks(built.blocks)
    said = _said(built)
    assert "5 notices for admins" in said
    assert "1 process runs on n1 GPU 0" in said
    assert "11 processes run on n2 GPU 1" in said
    assert "2 older notices no longer shown here." in said


def test_a_long_digest_stays_within_slack_s_limits() -> None:
    """Forty long lines: sections under 3,000 characters, under 50 blocks, a short fallback."""
    built = admin_digest([f"line {i} " + "x" * 390 for i in range(40)])
    validate_blocks(built.blocks)
    assert len(built.blocks) < 50
    assert len(built.text) <= 300
