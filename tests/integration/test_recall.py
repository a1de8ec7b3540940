"""Lender recall as timelines: a team asks for GPUs inside its nominal quota while another team
holds them on loan; the borrowed lease is warned, given its notice, reclaimed, and the lender's
request is granted. Minute by minute, with the sweep, the queue and the deliveries running as
the scheduler runs them.

In the shipped l40s pool (8 GPUs): nlp's Carol holds nlp's nominal 3, nlp's Dave 2 more on loan
(approved by an admin), platform's Erin her nominal 2. One GPU is free when vision's Alice asks
for her team's nominal 3.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bot.localslack import LocalSlack
from bot.services import BorrowAsk
from bot.services.results import BorrowResult, SettleResult
from bot.settings import DEFAULT_RULES_DIR
from rules.domain import Outcome, Priority
from storage import audit
from tests.integration.conftest import settings_for, story_with
from tests.integration.story import ALICE, ERIN, Story, busy

CAROL, DAVE, BOB, VICTOR = "U0CAROL01", "U0DAVE001", "U0BOB0001", "U0VMGR001"
APPROVALS = "C0VAPPROV"  # vision's approval channel


def lend_out(story: Story) -> dict[str, int]:
    """Minute 0: the pool as described above; everyone's GPUs stay busy."""
    return {
        CAROL: story.borrow(CAROL, "l40s", 3, hours=8),
        DAVE: story.borrow(DAVE, "l40s", 2, hours=8),
        ERIN: story.borrow(ERIN, "l40s", 2, hours=8),
    }


def alice_asks(story: Story) -> int:
    result = story.bot.services.borrow(ALICE, BorrowAsk("l40s", 3, timedelta(hours=4)))
    assert isinstance(result, BorrowResult)
    assert Outcome.QUEUE == result.outcome
    return result.request.id


def test_a_borrowed_lease_is_warned_given_its_notice_reclaimed_and_the_lender_served(
    story: Story,
) -> None:
    leases = lend_out(story)
    story.run(70, busy, lease=list(leases.values()))
    request = alice_asks(story)  # recalls Dave's lease at once: nlp holds 5 of its 3
    queue = story.answer(ALICE, "queue")
    assert "First of team vision's requests in the l40s queue; 1 GPU free now." in queue
    assert f"borrowed GPUs are recalled: L{leases[DAVE]} (<@{DAVE}>, 2 GPUs, team nlp)" in queue
    story.run(130, busy, lease=list(leases.values()))
    granted = story.bot.services.leases(ALICE)
    assert 1 == len(granted)
    assert [
        (71, "warn preempt"),
        (101, "reclaim preempted"),
        (101, f"granted L{granted[0].id} to {ALICE}"),
    ] == story.lease_events()
    assert "reclaimed" == story.state(leases[DAVE])
    assert "active" == story.state(leases[CAROL]) == story.state(leases[ERIN])

    warning = next(d for d in story.posted(DAVE) if "is recalled" in d)
    assert "borrowed from team *vision*'s guaranteed share" in warning
    assert f"vision needs them back for R{request}" in warning
    assert "Release now" in warning
    assert "Extend" not in warning  # a recalled lease cannot be extended
    assert any("its lender needs the GPUs back" in d for d in story.dms(DAVE))
    # Once reclaimed, the warning says so and offers nothing to click.
    assert not any("Release now" in d for d in story.dms(DAVE))
    why = story.answer(ALICE, f"why R{request}")
    assert f"recalled for R{request} of team vision" in why
    with story.bot.db.read() as session:
        assert audit.verify(session).ok


def test_a_recalled_lease_cannot_be_extended_and_says_why(story: Story) -> None:
    leases = lend_out(story)
    story.run(70, busy, lease=list(leases.values()))
    request = alice_asks(story)
    answer = story.answer(DAVE, f"extend L{leases[DAVE]} +2h")
    assert f"L{leases[DAVE]} is being recalled" in answer
    assert f"needs them back for R{request}" in answer
    mine = story.answer(DAVE, "mine")
    assert f"Recalled: team vision (R{request}) needs these borrowed GPUs back" in mine
    assert "lease_extend" not in mine  # no Extend button on a recalled lease
    assert "lease_release" in mine


def test_a_recall_no_longer_needed_is_withdrawn_and_the_holder_told(story: Story) -> None:
    """Carol releases her 3 GPUs at 80: Alice is served from them, and Dave keeps his."""
    leases = lend_out(story)
    story.run(70, busy, lease=list(leases.values()))
    alice_asks(story)
    story.run(80, busy, lease=list(leases.values()))
    story.bot.services.release(CAROL, leases[CAROL])
    story.bot.deliverer.deliver_due()
    assert 1 == len(story.bot.services.leases(ALICE))
    story.run(200, busy, lease=[leases[DAVE], leases[ERIN]])
    assert "active" == story.state(leases[DAVE])
    assert [(71, "warn preempt")] == story.lease_events()
    assert any("no longer recalled" in d for d in story.dms(DAVE))
    with story.bot.db.read() as session:
        tags = [row.tag for row in audit.history(session, f"lease:{leases[DAVE]}")]
    assert ["lease:recalled", "lease:warned", "lease:recall-withdrawn"] == [
        t for t in tags if t.startswith(("lease:recall", "lease:warned"))
    ]


def test_a_lease_younger_than_the_minimum_runtime_is_recalled_only_once_it_is_old_enough(
    story: Story,
) -> None:
    """Alice asks at 30; Dave's lease is half an hour old, so the recall waits until 60."""
    leases = lend_out(story)
    story.run(30, busy, lease=list(leases.values()))
    alice_asks(story)
    story.run(100, busy, lease=list(leases.values()))
    assert [(60, "recall L2"), (60, "warn preempt"), (90, "reclaim preempted")] == [
        e for e in story.lease_events() if not e[1].startswith("granted")
    ]


def asked(story: Story, user: str, gpus: int) -> tuple[int, str]:
    """A high-priority borrow from a vision member: asked, and the card on vision's channel."""
    result = story.bot.services.borrow(
        user, BorrowAsk("l40s", gpus, timedelta(hours=4), Priority.HIGH)
    )
    assert isinstance(result, BorrowResult)
    assert Outcome.ASK == result.outcome
    story.bot.deliverer.deliver_due()
    return result.request.id, json.dumps(story.local.messages(APPROVALS)[-1].blocks)


def test_approval_cards_say_whom_approving_overtakes_and_which_leases_it_recalls(
    story: Story,
) -> None:
    """Alice asks for her nominal at high priority, so vision's manager decides: the card says
    approving recalls Dave's lease. Then Bob's high-priority single GPU would fit the free one:
    his card says approving grants it ahead of Alice's waiting request."""
    leases = lend_out(story)
    story.run(70, busy, lease=list(leases.values()))
    services = story.bot.services
    alice, card = asked(story, ALICE, 3)
    assert f"*recalls* L{leases[DAVE]} (<@{DAVE}>, 2 GPUs, team nlp borrowing)" in card
    assert "active" == story.state(leases[DAVE])  # nothing is recalled before the approval

    assert isinstance(services.approve(VICTOR, alice), SettleResult)
    assert [] == services.leases(ALICE)  # approved, waiting for the recalled GPUs
    _, card = asked(story, BOB, 1)
    assert f"grants it at once, *ahead of* R{alice}" in card
    story.run(110, busy, lease=list(leases.values()))
    assert "reclaimed" == story.state(leases[DAVE])
    assert 1 == len(services.leases(ALICE))


@pytest.fixture
def preempting(local: LocalSlack, tmp_path: Path) -> Iterator[Story]:
    """The shipped rules with `preemption: {within_team: lower_priority}`."""
    rules = shutil.copytree(DEFAULT_RULES_DIR, tmp_path / "rules")
    limits = rules / "limits.yaml"
    limits.write_text(limits.read_text().replace("within_team: off", "within_team: lower_priority"))
    settings = settings_for(local, tmp_path).model_copy(update={"rules_dir": rules})
    with story_with(settings, local) as told:
        yield told


def test_a_low_priority_lease_of_the_team_is_preempted_for_its_high_priority_request(
    preempting: Story,
) -> None:
    """Bob holds vision's 3 at low priority, Carol and Erin their nominals: l40s is full and
    nothing is borrowed. At 70 Alice asks for 2 at high priority; once Victor approves, Bob's
    lease is preempted for her: warned at once, reclaimed after the notice, Alice served."""
    story = preempting
    services = story.bot.services
    low = services.borrow(BOB, BorrowAsk("l40s", 3, timedelta(hours=8), Priority.LOW))
    assert isinstance(low, BorrowResult)
    assert low.lease is not None
    leases = [low.lease.id, story.borrow(CAROL, "l40s", 3, hours=8)]
    leases.append(story.borrow(ERIN, "l40s", 2, hours=8))
    story.run(70, busy, lease=leases)
    alice, card = asked(story, ALICE, 2)
    assert f"*preempts* L{low.lease.id} (<@{BOB}>, 3 GPUs)" in card
    assert isinstance(services.approve(VICTOR, alice), SettleResult)
    queue = story.answer(ALICE, "queue")
    assert f"preempted for it: L{low.lease.id} (<@{BOB}>, 3 GPUs, team vision)" in queue
    story.run(130, busy, lease=leases)
    assert "reclaimed" == story.state(low.lease.id)
    assert 1 == len(services.leases(ALICE))
    warning = next(d for d in story.posted(BOB) if "is preempted" in d)
    assert f"preempted for R{alice}, a higher-priority request of your team *vision*" in warning
    assert "borrowed" not in warning
    assert any("a higher-priority request of your team needs the GPUs" in d for d in story.dms(BOB))
    assert any(
        "reclaimed because a higher-priority request of its team needed" in d
        for d in story.dms(BOB)
    )
    assert not any("lender" in d for d in story.dms(BOB))
    why = story.answer(ALICE, f"why R{alice}")
    assert f"preempted for R{alice}, a high-priority request of your team vision" in why
