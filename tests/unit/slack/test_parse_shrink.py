"""`/gpu release L7 gpus node:2,3` and `/gpu release L7 keep 1`: the forms and their problems."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from bot.slack.parse import Command, ParseProblem, Release, Shrink, parse


def read(text: str) -> object:
    now = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    return parse(text, now=now, tz=ZoneInfo("Europe/Berlin"), pools=("a100",))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("release L7 gpus a100-node-01:2,3",
         Shrink(7, gpus=(("a100-node-01", 2), ("a100-node-01", 3)))),
        ("release 7 gpu n1:0 n2:5", Shrink(7, gpus=(("n1", 0), ("n2", 5)))),
        ("release L7 GPUS Node.B:1", Shrink(7, gpus=(("Node.B", 1),))),
        ("release L7 keep 1", Shrink(7, keep=1)),
        ("release l7 KEEP 0", Shrink(7, keep=0)),  # the use case says "that is a release"
        ("release L7", Release(7)),
    ],
)  # fmt: skip
def test_release_with_gpus_or_keep_reads_as_a_shrink(text: str, expected: Command) -> None:
    """Naming GPUs, or how many to keep, shrinks the lease instead of ending it."""
    assert expected == read(text)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("release L7 gpus", "Which GPUs? Name them as host:index"),
        ("release L7 gpus node", "I did not understand `node`: name GPUs as host:index"),
        ("release L7 gpus node:a", "I did not understand `node:a`"),
        ("release L7 gpus node:1,", "I did not understand `node:1,`"),
        ("release L7 keep", "Keep how many GPUs? `/gpu release L7 keep 1`."),
        ("release L7 keep one", "Keep how many GPUs?"),
        ("release L7 keep 1 2", "Keep how many GPUs?"),
        ("release L7 L8", "`/gpu release L7 keep 1` keeps one of its GPUs"),
    ],
)
def test_a_shrink_that_does_not_parse_says_how(text: str, fragment: str) -> None:
    """Each problem says what was wrong and how to write it."""
    problem = read(text)
    assert isinstance(problem, ParseProblem)
    assert fragment in problem.message()
