"""The partly-idle warning and the shrink replies: valid Block Kit, within Slack's limits, and
saying plainly what is idle, what went back and what stays."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.services.results import GpuSlot, ShrinkResult
from bot.slack.blocks.kit import Message
from bot.slack.blocks.shrinking import kept_reply, shrink_reply
from bot.slack.blocks.warnings import (
    GIVE_BACK_IDLE_ACTION,
    KEEP_ALL_ACTION,
    SNOOZE_ACTION,
    ended_warning_message,
    warning_message,
)
from tests.unit.slack.builders import T0, a_lease, assert_within_limits, texts_of

FOUR = tuple(GpuSlot("a100-node-01", i) for i in range(4))
MANY = tuple(GpuSlot(f"a100-node-{n:02}", i) for n in range(40) for i in range(8))


def partly_idle(
    idle: list[str], *, snoozes_left: int = 2, gpus: tuple[GpuSlot, ...] = FOUR
) -> Message:
    return warning_message(
        a_lease(gpus=gpus),
        "partly_idle",
        "3 of the 4 GPUs of lease 7 have been idle for 1h 30m",
        grace=timedelta(minutes=30),
        now=T0,
        time_left_min=300,
        idle_for_min=90,
        snoozes_left=snoozes_left,
        idle=idle,
    )


def buttons(built: Message) -> list[tuple[str, str]]:
    return [
        (e["text"]["text"], e["action_id"])
        for b in built.blocks
        if b["type"] == "actions"
        for e in b["elements"]
    ]


@pytest.mark.parametrize(
    "build",
    [
        lambda: partly_idle(["a100-node-01:1", "a100-node-01:2", "a100-node-01:3"]),
        lambda: partly_idle(["a100-node-01:3"], snoozes_left=0),
        lambda: partly_idle([f"{s.node}:{s.index}" for s in MANY[1:]], gpus=MANY),
        lambda: shrink_reply(ShrinkResult(a_lease(gpus=FOUR[:1]), FOUR[1:])),
        lambda: shrink_reply(ShrinkResult(a_lease(gpus=MANY[:1]), MANY[1:], (a_lease(id=9),))),
        lambda: kept_reply(a_lease(gpus=FOUR)),
        lambda: ended_warning_message(a_lease(state="released"), "partly_idle", "idle"),
    ],
    ids=["3 of 4", "no snoozes left", "320 GPUs", "shrunk", "shrunk, 320 GPUs", "kept", "ended"],
)
def test_the_shrink_surfaces_validate_and_stay_within_slack_limits(build: object) -> None:
    assert callable(build)
    assert_within_limits(build())


def test_the_partly_idle_warning_names_the_idle_gpus_and_offers_three_answers() -> None:
    built = partly_idle(["a100-node-01:1", "a100-node-01:2", "a100-node-01:3"])
    text = texts_of(built)
    assert "3 of your 4 GPUs in *L7* have been idle for 1h 30m: a100-node-01 GPUs 1, 2, 3." in text
    assert "the busy GPUs stay yours" in text
    assert [
        ("Give back the 3 idle GPUs", GIVE_BACK_IDLE_ACTION),
        ("Still using", SNOOZE_ACTION),
        ("Keep", KEEP_ALL_ACTION),
    ] == buttons(built)
    assert text.count("have been idle") == 1  # the reason is not said twice


def test_one_idle_gpu_is_spoken_of_in_the_singular_and_still_using_runs_out() -> None:
    built = partly_idle(["a100-node-01:3"], snoozes_left=0)
    assert "1 of your 4 GPUs in *L7* has been idle for 1h 30m: a100-node-01 GPU 3." in texts_of(
        built
    )
    assert ["Give back the idle GPU", "Keep"] == [label for label, _ in buttons(built)]


def test_the_shrink_reply_says_what_went_back_what_stays_and_who_started() -> None:
    text = texts_of(shrink_reply(ShrinkResult(a_lease(gpus=FOUR[:1]), FOUR[1:], (a_lease(id=9),))))
    assert "*L7* gave back 3 GPUs (a100-node-01 GPUs 1, 2, 3). It keeps 1 GPU in *a100*" in text
    assert "`CUDA_VISIBLE_DEVICES=0`" in text
    assert "The freed GPUs went to the queue at once: L9 started." in text
