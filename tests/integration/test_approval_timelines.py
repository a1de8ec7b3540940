"""Requests waiting for a manager, told minute by minute: reminders in the card's thread and by
DM, escalation to the admins, expiry with *Ask again*, the pause, the requester's throttled
*Remind approvers*, and an extension still pending as its lease nears its end.

Time is frozen and moved by the test; each pass is the sweep job, then the outbox delivery.
"""

from __future__ import annotations

import json
from datetime import timedelta

from sqlmodel import col, select

from bot.localslack.model import Message
from bot.services import BorrowAsk
from bot.services.results import BorrowResult, Refused, SettleResult
from rules.domain import Outcome
from storage.tables import AuditRow
from tests.integration.story import ADA, ALICE, T0, Story, busy

VMGR, CHANNEL = "U0VMGR001", "C0VAPPROV"
LIFECYCLE = ("request:reminded", "request:escalated", "request:expired", "request:would-have")


def at(story: Story, minute: int) -> None:
    """Move to minute `minute` after T0 and run one pass of the sweep job."""
    story.clock.move_to(T0 + timedelta(minutes=minute))
    story.minute = minute
    story.pass_()


def ask(story: Story, hours: float = 48) -> int:
    """Alice asks for an a100 for longer than a day: her team's manager is asked."""
    result = story.bot.services.borrow(ALICE, BorrowAsk("a100", 1, timedelta(hours=hours)))
    assert isinstance(result, BorrowResult)
    assert Outcome.ASK == result.outcome
    story.pass_()
    return result.request.id


def steps(story: Story) -> list[tuple[int, str]]:
    """Each lifecycle audit row: (minute after T0, tag)."""
    with story.bot.db.read() as session:
        found = session.exec(
            select(AuditRow).where(col(AuditRow.tag).in_(LIFECYCLE)).order_by(col(AuditRow.id))
        ).all()
        return [(int((r.at - T0).total_seconds() // 60), r.tag) for r in found]


def card(story: Story) -> Message:
    (posted,) = [m for m in story.local.messages(CHANNEL) if not m.is_reply]
    return posted


def thread(story: Story, parent: Message) -> list[str]:
    return [
        m.text for m in story.local.messages(CHANNEL) if m.is_reply and m.thread_ts == parent.ts
    ]


def test_a_request_nobody_decides_is_reminded_escalated_and_expires(story: Story) -> None:
    """Reminders at 30 and 150 in the card's thread and by DM; escalated to the admin at 240,
    reminded again 2 h later; expired at 24 h with the card redrawn and *Ask again*, which
    files it once more."""
    request = ask(story)
    for minute in (29, 30, 31, 149, 150, 240, 241):
        at(story, minute)
    assert "Escalated to <@U0ADMIN01> after 4h" in json.dumps(card(story).blocks)
    for minute in (270, 359, 360, 600, 1439, 1440, 1441):
        at(story, minute)
    assert [
        (30, "request:reminded"),
        (150, "request:reminded"),
        (240, "request:escalated"),
        (360, "request:reminded"),
        (1440, "request:expired"),
    ] == steps(story)
    parent = card(story)
    replies = thread(story, parent)
    assert 3 == len(replies)
    assert all(f"Still waiting for you, <@{VMGR}>" in r for r in replies)
    assert f"<@{VMGR}> and <@{ADA}>" in replies[2]  # escalated by then
    assert "filed 30m ago" in replies[0]
    assert "filed 6h ago" in replies[2]
    manager_dms = story.dms(VMGR)
    assert 3 == sum("Still waiting for you" in m for m in manager_dms)
    # escalation: a card of its own in the admin's DM, and the mark on every card
    admin_cards = [m for m in story.dms(ADA) if f"GPU request R{request}: " in m]
    assert admin_cards, story.dms(ADA)
    # expiry: the cards lose their buttons and say why; Alice hears, with Ask again
    shown = json.dumps(parent.blocks)
    assert "Expired after 1d, nobody decided. Withdrawn" in shown
    assert "request_approve" not in shown
    for message in story.local.messages(story.local.dm_channel(ADA)):
        if f"GPU request R{request}" in json.dumps(message.blocks):
            assert "request_approve" not in json.dumps(message.blocks)
    gone = story.bot.services.request(request)
    assert gone is not None
    assert "cancelled" == gone.state
    (expired,) = [m for m in story.dms(ALICE) if "Expired after 1d, nobody decided" in m]
    assert "request_ask_again" in expired
    why = story.answer(ALICE, f"why R{request}")
    assert "`request:reminded` by gpubot: reminded Victor Vision" in why  # names, not ids
    assert "`request:escalated` by gpubot: escalated to Ada Admin" in why
    assert "`request:expired` by gpubot: withdrawn, as nobody decided within 1d" in why
    # Ask again: the same request, filed again
    story.click_in_dm(ALICE, "request_ask_again")
    again = story.bot.services.requests(ALICE)
    assert [request + 1] == [r.id for r in again if r.state == "pending"]
    assert ("a100", 1, timedelta(hours=48)) == (again[-1].pool, again[-1].gpus, again[-1].duration)
    # a second click files nothing: it says where the first one's request stands
    story.click_in_dm(ALICE, "request_ask_again")
    reply = json.dumps(story.local.calls.of("response_url")[-1].args)
    assert f"You asked again already: R{request + 1} is waiting for <@U0VMGR001>" in reply
    assert [request + 1] == [
        r.id for r in story.bot.services.requests(ALICE) if r.state == "pending"
    ]
    assert f"asked again as R{request + 1}" in story.answer(ALICE, f"why R{request}")


def test_while_paused_expiry_is_only_recorded_and_reminders_still_go(story: Story) -> None:
    """Paused: reminders go, expiry is a "would have" recorded once; after resume the next
    pass withdraws it."""
    story.bot.services.pause(ADA)
    request = ask(story)
    for minute in (30, 1440, 1441, 1500):
        at(story, minute)
    assert (1440, "request:would-have") in steps(story)
    assert 1 == sum(tag == "request:would-have" for _, tag in steps(story))
    assert (30, "request:reminded") in steps(story)
    pending = story.bot.services.request(request)
    assert pending is not None
    assert "pending" == pending.state
    story.bot.services.resume(ADA)
    at(story, 1501)
    assert (1501, "request:expired") == steps(story)[-1]


def test_remind_approvers_is_throttled_to_once_every_15_minutes(story: Story) -> None:
    """The requester's button reminds at once; a second click 5 minutes later says when it
    works again; after 15 minutes it works again. Each nudge is audited."""
    story.answer(ALICE, "borrow 1 a100 for 2d because a long ablation")
    story.pass_()
    waiting = story.local.ephemerals(ALICE)[-1]
    assert "request_remind" in json.dumps(waiting.blocks)
    story.slack.click(ALICE, waiting, "request_remind")
    story.bot.inbox.wait_idle()
    story.pass_()
    parent = card(story)
    assert 1 == len(thread(story, parent))
    assert "asked me to remind you" in thread(story, parent)[0]
    story.clock.tick(timedelta(minutes=5))
    before = len(story.local.calls.of("response_url"))
    story.slack.click(ALICE, waiting, "request_remind")
    story.local.wait_for(
        "response_url", lambda a: len(story.local.calls.of("response_url")) > before
    )
    said = json.dumps(story.local.calls.of("response_url")[-1].args)
    assert "You reminded them 5 min ago; you can again at" in said
    story.pass_()
    assert 1 == len(thread(story, parent))
    story.clock.tick(timedelta(minutes=10))
    story.slack.click(ALICE, waiting, "request_remind")
    story.bot.inbox.wait_idle()
    story.pass_()
    assert 2 == len(thread(story, parent))
    with story.bot.db.read() as session:
        nudges = session.exec(select(AuditRow).where(AuditRow.tag == "request:nudged")).all()
    assert [ALICE, ALICE] == [n.actor for n in nudges]


def test_an_extension_still_pending_near_the_lease_end_is_said_plainly(story: Story) -> None:
    """Alice clicks Extend on a borrowed lease; her manager does not answer. At the first
    expiry warning she is told the extension still waits and when the lease ends; the lease
    ends as it said; the manager's late Approve is refused with that reason."""
    story.borrow(ALICE, "a100", 8, hours=2)  # the team's whole nominal
    lease = story.borrow(ALICE, "a100", 1, hours=2)  # borrowed: extending it asks the manager
    extended = story.bot.services.extend(ALICE, lease, timedelta(hours=2))
    assert not isinstance(extended, Refused)
    assert Outcome.ASK == extended.outcome
    assert extended.request is not None
    request = extended.request.id
    story.run(61, busy, lease=lease)
    told = [m for m in story.dms(ALICE) if "is still waiting for" in m]
    assert 1 == len(told)
    assert f"Your extension request R{request} (+2h for L{lease}) is still waiting for" in told[0]
    assert f"<@{VMGR}>; L{lease} ends at <!date^" in told[0]
    assert "unless it is approved before then" in told[0]
    story.run(200, busy, lease=lease)
    assert 1 == sum("is still waiting for" in m for m in story.dms(ALICE))  # told once
    assert "reclaimed" == story.state(lease)
    late = story.bot.services.approve(VMGR, request)
    assert isinstance(late, SettleResult)
    assert late.already_settled
    assert f"R{request} can no longer be approved: L{lease} ended before anyone answered" in (
        late.message
    )
    withdrawn = [m for m in story.dms(ALICE) if f"R{request} was withdrawn" in m]
    assert withdrawn, story.dms(ALICE)
    assert [(60, "request:still-pending")] == steps_with(story, "request:still-pending")


def steps_with(story: Story, tag: str) -> list[tuple[int, str]]:
    with story.bot.db.read() as session:
        found = session.exec(select(AuditRow).where(AuditRow.tag == tag)).all()
        return [(int((r.at - T0).total_seconds() // 60), r.tag) for r in found]
