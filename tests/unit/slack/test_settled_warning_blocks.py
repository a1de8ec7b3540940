"""A warning that no longer stands: one line on what became of it, no buttons, within limits."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.services.results import GpuSlot
from bot.slack.blocks.warnings import settled_warning_message
from rules.settled import Settled
from tests.unit.slack.builders import T0, a_lease, assert_within_limits, texts_of

ONE = (GpuSlot("a100-node-01", 0),)


@pytest.mark.parametrize(
    ("reason", "outcome", "extra", "said"),
    [
        ("expiry", Settled.EXTENDED, {"by": "Victor Vision"}, "by Victor Vision's approval."),
        ("expiry", Settled.EXTENDED, {}, "Extended to <!date^"),
        (
            "partly_idle",
            Settled.GAVE_BACK,
            {"given": ("a100-node-01:1", "a100-node-01:2", "a100-node-01:3")},
            "You gave back 3 GPUs (a100-node-01 GPUs 1, 2, 3); L7 keeps a100-node-01 GPU 0.",
        ),
        ("partly_idle", Settled.KEPT, {}, "You chose to keep the GPU;"),
        ("idle", Settled.SNOOZED, {"until": T0 + timedelta(hours=2)}, "Snoozed: no idle warnings"),
        ("expiry", Settled.SUPERSEDED, {}, "Superseded by the warning below."),
        ("preempt", Settled.WITHDRAWN, {}, "The recall was withdrawn"),
        ("idle", Settled.CLEARED, {}, "the GPUs are busy again"),
    ],
)
def test_a_settled_warning_says_what_became_of_it_without_buttons(
    reason: str, outcome: Settled, extra: dict[str, object], said: str
) -> None:
    built = settled_warning_message(a_lease(gpus=ONE), reason, outcome, **extra)  # type: ignore[arg-type]
    assert said in texts_of(built)
    assert all(block["type"] != "actions" for block in built.blocks)
    assert_within_limits(built)
