"""Request facts are derived in Python: used_after, borrowed_after and what others lend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from rules.catalogue import CATALOGUE
from rules.domain import Priority, RequestKind, Subject, plural
from rules.engine import check_facts
from rules.facts import PoolUsage, lendable, request_facts
from rules.policy import render
from tests.builders import default_policy


def test_a_borrow_beyond_nominal_counts_what_would_be_borrowed() -> None:
    """vision holds 7 of its nominal 8 and asks for 3: 10 after, 2 borrowed."""
    facts = request_facts(
        default_policy(),
        kind=RequestKind.BORROW,
        user="U0ALICE01",
        team="vision",
        pool="a100",
        gpus=3,
        duration=timedelta(hours=6),
        priority=Priority.HIGH,
        has_reason=False,
        usage=PoolUsage(held={"vision": 7, "nlp": 1}, free=8, queued=1),
    )
    check_facts(Subject.REQUEST, facts)
    assert CATALOGUE[Subject.REQUEST].keys() == facts.keys()
    assert (10, 2, 12) == (
        facts["team.used_after"],
        facts["team.borrowed_after"],
        facts["team.limit"],
    )
    assert 360.0 == facts["request.duration"]
    assert 2 == facts["request.priority_rank"]
    # nlp lends min(4, 6 - 1) = 4, platform lends min(2, 2 - 0) = 2
    assert 6 == facts["pool.lendable"]


def test_an_extension_adds_no_gpus_and_totals_the_extra_time() -> None:
    """Extensions keep team.used_after at team.used and add up the extension time."""
    facts = request_facts(
        default_policy(),
        kind=RequestKind.EXTEND,
        user="U0ALICE01",
        team="vision",
        pool="a100",
        gpus=2,
        duration=timedelta(hours=2),
        priority=Priority.NORMAL,
        has_reason=True,
        usage=PoolUsage(held={"vision": 2}, free=10),
        lease_extensions=1,
        lease_extended=timedelta(hours=3),
    )
    assert 2 == facts["team.used_after"]
    assert (180.0, 300.0) == (facts["lease.extended"], facts["lease.extended_after"])
    assert 2 == facts["lease.extensions_after"]  # the second extension: "extension 2 of 2"


def test_lending_stops_at_each_lenders_lending_limit_and_unused_nominal() -> None:
    """A team over its nominal lends nothing; a team lends at most its lending_limit."""
    policy = default_policy()
    assert 0 == lendable(policy, "a100", "vision", {"nlp": 7, "platform": 2})
    assert 2 == lendable(policy, "a100", "vision", {"nlp": 6})
    assert 0 == lendable(policy, "inference", "vision", {})


def test_what_other_borrowers_took_is_no_longer_lendable() -> None:
    """a100: vision lends at most 4 of its unused 8. nlp already borrows 4 of them, so platform
    may borrow none; were nlp to borrow 2, platform could take the other 2."""
    policy = default_policy()
    assert 0 == lendable(policy, "a100", "platform", {"nlp": 10, "platform": 2})
    assert 2 == lendable(policy, "a100", "platform", {"nlp": 8, "platform": 2})


@pytest.mark.parametrize(
    ("owed", "expected"),
    [
        ({}, 4),  # vision's unused 8, within its lending limit of 4
        ({"vision": 4}, 4),  # its waiting guarantees leave 4 unused: still 4 to lend
        ({"vision": 6}, 2),
        ({"vision": 8}, 0),  # all of its nominal is counted on
        ({"platform": 2}, 4),  # the borrower's own waiting requests lend nothing
    ],
)
def test_what_a_lenders_waiting_guarantees_count_on_is_not_lendable(
    owed: dict[str, int], expected: int
) -> None:
    """a100: nlp holds its nominal 6, vision nothing; platform asks to borrow."""
    policy = default_policy()
    assert expected == lendable(policy, "a100", "platform", {"nlp": 6}, owed)
    usage = PoolUsage(held={"nlp": 6}, free=10, owed=owed)
    facts = request_facts(
        policy,
        kind=RequestKind.BORROW,
        user="U0ERIN001",
        team="platform",
        pool="a100",
        gpus=4,
        duration=timedelta(hours=2),
        priority=Priority.NORMAL,
        has_reason=True,
        usage=usage,
    )
    assert expected == facts["pool.lendable"]


@pytest.mark.parametrize(
    ("template", "facts", "expected"),
    [
        ("{gpu.processes|process} run", {"gpu.processes": 1}, "1 process run"),
        ("{gpu.processes|process} run", {"gpu.processes": 2}, "2 processes run"),
        ("{pool.lendable|unused GPU} to lend", {"pool.lendable": 0}, "no unused GPUs to lend"),
        ("{pool.lendable|unused GPU}", {"pool.lendable": 1.0}, "1 unused GPU"),
        ("{request.duration}", {"request.duration": 90}, "1h 30m"),
    ],
)
def test_because_counts_agree_with_their_nouns(
    template: str, facts: dict[str, Any], expected: str
) -> None:
    """`{fact|noun}` says 1 process, 2 processes, and no unused GPUs for zero."""
    assert expected == render(template, facts)


def test_plural_is_one_helper_for_every_noun() -> None:
    assert ["1 GPU", "2 GPUs", "1 process", "3 processes", "0 requests"] == [
        plural(1, "GPU"),
        plural(2, "GPU"),
        plural(1, "process"),
        plural(3, "process"),
        plural(0, "request"),
    ]
