"""Pause means pause, as a timeline: while automation is paused a lender recall is only
recorded and told to the admins; after resume it runs its usual course (warning, notice,
reclaim, grant). The l40s pool as in `test_recall`: nlp's Dave holds 2 GPUs on loan when
vision's Alice asks for her team's nominal 3."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import select

from bot.services import BorrowAsk
from bot.services.results import BorrowResult
from rules.domain import Outcome
from storage.tables import AuditRow
from tests.integration.story import ADA, ALICE, ERIN, Story, busy

CAROL, DAVE = "U0CAROL01", "U0DAVE001"


def test_a_recall_while_paused_is_recorded_once_and_runs_after_resume(story: Story) -> None:
    assert isinstance(story.bot.services.pause(ADA), str)
    leases = [
        story.borrow(CAROL, "l40s", 3, hours=8),
        story.borrow(DAVE, "l40s", 2, hours=8),
        story.borrow(ERIN, "l40s", 2, hours=8),
    ]
    story.run(70, busy, lease=leases)
    asked = story.bot.services.borrow(ALICE, BorrowAsk("l40s", 3, timedelta(hours=4)))
    assert isinstance(asked, BorrowResult)
    assert Outcome.QUEUE == asked.outcome
    story.run(200, busy, lease=leases)
    assert [] == story.lease_events()  # no warning, no reclaim, no grant
    assert "active" == story.state(leases[1])
    told = [d for d in story.dms(ADA) if "would have been recalled" in d]
    assert 1 == len(told)
    assert f"L{leases[1]} of <@{DAVE}> would have been recalled for R{asked.request.id}" in told[0]
    with story.bot.db.read() as session:
        tags = session.exec(select(AuditRow.tag)).all()
    assert 1 == tags.count("recall:would-have")
    assert "lease:recalled" not in tags

    assert isinstance(story.bot.services.resume(ADA), str)
    story.run(300, busy, lease=leases)
    (granted,) = story.bot.services.leases(ALICE)
    assert [
        (201, f"recall L{leases[1]}"),
        (201, "warn preempt"),
        (231, "reclaim preempted"),
        (231, f"granted L{granted.id} to {ALICE}"),
    ] == story.lease_events()
