"""Messages follow the state: once a lease ends its grant and warning DMs are redrawn in place,
without buttons, saying how and when it ended; settled approval cards lose their buttons; an
extension still waiting when its lease ends is withdrawn and its requester told."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlmodel import select

from bot.localslack import Message
from bot.services.notices import CARD_NUMBERS_EVERY
from bot.services.results import ExtendResult
from rules.domain import RequestState
from storage.tables import AuditRow, OutboxRow, RequestRow
from tests.integration.story import ADA, ALICE, Story, busy, idle

BOB = "U0BOB0001"
APPROVALS = "C0VAPPROV"
VICTOR = "U0VMGR001"
BUTTONS = ("lease_extend", "lease_release", "lease_snooze", "request_approve", "request_deny")


def _dm(story: Story, user: str) -> list[Message]:
    return story.local.messages(story.local.dm_channel(user))


def _has_buttons(message: Message) -> bool:
    return any(b in json.dumps(message.blocks) for b in BUTTONS)


def _said(message: Message) -> str:
    return message.text + json.dumps(message.blocks)


def test_a_released_lease_s_grant_dm_loses_its_buttons_and_says_it_ended(story: Story) -> None:
    """Release from the grant DM's own button: the DM is redrawn in place, no buttons, with
    how and when the lease ended."""
    lease = story.borrow(ALICE, "a100", 2, hours=6)
    story.run(5, busy, lease=lease)
    [grant] = _dm(story, ALICE)
    assert _has_buttons(grant)
    story.click_in_dm(ALICE, "lease_release")
    story.pass_()
    assert "released" == story.state(lease)
    now = next(m for m in _dm(story, ALICE) if m.ts == grant.ts)
    assert not _has_buttons(now)
    assert f"L{lease} ended 2026-03-02 09:05 UTC: released." == now.text
    assert "CUDA_VISIBLE_DEVICES=0,1" in _said(now)  # where it ran stays on record
    assert [] == story.local.violations


def test_a_reclaimed_lease_s_grant_and_warning_dms_say_it_was_reclaimed(story: Story) -> None:
    """Idle: warned at 91, reclaimed at 121. The grant DM and the idle warning are both
    redrawn without their buttons, each saying it was reclaimed because it stayed idle."""
    lease = story.borrow(ALICE, "a100", 1, hours=8)
    story.run(130, idle, lease=lease)
    assert "reclaimed" == story.state(lease)
    grant, warning, reclaimed = _dm(story, ALICE)[:3]
    ended = (
        f"L{lease} ended 2026-03-02 11:01 UTC: reclaimed because its GPUs stayed idle "
        "after the warning."
    )
    for shown in (grant, warning):
        assert not _has_buttons(shown), shown.blocks
        assert ended == shown.text
    assert "warned of idle GPUs" in _said(warning)
    assert "was reclaimed" in reclaimed.text
    updates = [c for c in story.local.calls.of("chat.update") if not c.faulted]
    assert {grant.ts, warning.ts} == {c.args["ts"] for c in updates}
    with story.bot.db.read() as session:
        closed = session.exec(select(OutboxRow).where(OutboxRow.kind == "lease_closed")).one()
    assert ("delivered", 1) == (closed.state, closed.attempts)


def test_a_lease_ended_before_its_grant_went_out_never_shows_buttons(story: Story) -> None:
    """Slack is down while a lease is granted and released: the grant DM, sent late, already
    says the lease ended, and there is nothing left to update."""
    story.local.faults.add("chat.postMessage", status=500, times=10_000)
    lease = story.borrow(ALICE, "a100", 1, hours=6)
    story.pass_()
    story.bot.services.release(ALICE, lease)
    story.local.faults.clear()
    story.clock.tick(timedelta(minutes=10))
    story.pass_()
    [grant] = _dm(story, ALICE)
    assert not _has_buttons(grant)
    assert f"L{lease} ended" in grant.text


def _extension_waiting(story: Story) -> tuple[int, int, Message]:
    """Bob borrows beyond his team's nominal, then asks to extend: a card for the manager."""
    story.borrow(ALICE, "a100", 8, hours=6)
    lease = story.borrow(BOB, "a100", 2, hours=6)
    asked = story.bot.services.extend(BOB, lease, timedelta(hours=2), "longer run")
    assert isinstance(asked, ExtendResult)
    request = asked.request
    assert request is not None
    assert "pending" == request.state
    story.pass_()
    card = story.local.messages(APPROVALS)[-1]
    assert f"R{request.id}" in card.text
    assert _has_buttons(card)
    return lease, request.id, card


def test_a_pending_extension_is_withdrawn_when_its_lease_ends(story: Story) -> None:
    """Bob releases the lease while its extension waits: the request is withdrawn with the
    reason, Bob is told by DM, and the card loses its buttons."""
    lease, request_id, card = _extension_waiting(story)
    story.bot.services.release(BOB, lease)
    story.pass_()
    with story.bot.db.read() as session:
        request = session.get(RequestRow, request_id)
        assert request is not None
        assert RequestState.CANCELLED == request.state
        tags = session.exec(
            select(AuditRow.tag).where(AuditRow.subject == f"request:{request_id}")
        ).all()
    assert 1 == tags.count("extend:withdrawn")
    assert "request:cancelled" not in tags  # withdrawn once, not again by the release
    told = _dm(story, BOB)[-1].text
    assert f"R{request_id} was withdrawn: L{lease} ended (released) before anyone answered." == (
        told
    )
    now = next(m for m in story.local.messages(APPROVALS) if m.ts == card.ts)
    assert not _has_buttons(now)
    assert "Withdrawn by" in _said(now)
    assert f"L{lease} ended (released)" in _said(now)


def test_a_pending_extension_is_withdrawn_when_its_lease_is_reclaimed(story: Story) -> None:
    """The lease expires and is reclaimed while its extension waits: withdrawn, Bob told."""
    lease, request_id, card = _extension_waiting(story)
    story.run(6 * 60 + 45, busy, lease=lease)
    assert "reclaimed" == story.state(lease)
    told = [m.text for m in _dm(story, BOB)]
    assert any(
        t.startswith(f"R{request_id} was withdrawn: L{lease} ended (reclaimed because it expired)")
        for t in told
    ), told
    now = next(m for m in story.local.messages(APPROVALS) if m.ts == card.ts)
    assert now.edited
    assert not _has_buttons(now)


def test_no_borrow_offer_for_the_gpu_just_reclaimed_from_the_same_person(story: Story) -> None:
    """Alice's idle lease is reclaimed while her process stays on the GPU: the admins hear of
    the unreserved use, but Alice is not invited to borrow back what was just taken."""
    lease = story.borrow(ALICE, "a100", 1, hours=8)
    story.run(130, idle, lease=lease)
    assert "reclaimed" == story.state(lease)
    assert (122, "notify a100-node-01:0") in story.events
    assert not any("without a lease" in m.text for m in _dm(story, ALICE))
    notices = [_said(m) for m in _dm(story, ADA) if "without a lease" in _said(m)]
    assert 1 == len(notices)
    assert (
        "a100-node-01 GPU 0 runs 1 process without a lease (Unix users: alice). "
        "Not offered a lease: alice, whose lease on it was just reclaimed."
    ) in notices[0]


def _give_up(story: Story, kind: str) -> None:
    """As if every update of this kind had been given up (Slack refused it for two hours)."""
    with story.bot.db.write() as session:
        for row in session.exec(select(OutboxRow).where(OutboxRow.kind == kind)).all():
            row.state = "failed"
            session.add(row)


def test_a_button_on_an_ended_lease_s_dm_says_how_it_ended_and_redraws_it(
    story: Story,
) -> None:
    """The DM still offers buttons (its update was given up): Extend is refused with how and
    when the lease ended, and the DM is redrawn without buttons."""
    lease = story.borrow(ALICE, "a100", 1, hours=6)
    story.run(5, busy, lease=lease)
    story.bot.services.release(ALICE, lease)
    _give_up(story, "lease_closed")
    story.click_in_dm(ALICE, "lease_extend")
    reply = json.dumps(story.local.calls.of("response_url")[-1].args)
    assert f"L{lease} ended 2026-03-02 09:05 UTC: released. Nothing is left to change" in reply
    story.pass_()
    grant = _dm(story, ALICE)[0]
    assert not _has_buttons(grant)
    assert f"L{lease} ended 2026-03-02 09:05 UTC: released." == grant.text


def _bob_asks(story: Story) -> tuple[int, Message]:
    """Alice holds the vision nominal; Bob asks for 2 more: a card with buttons."""
    story.borrow(ALICE, "a100", 8, hours=6)
    asked = story.answer(BOB, "borrow 2 a100 for 4h because sweep")
    assert "needs approval" in asked
    story.pass_()
    [card] = story.local.messages(APPROVALS)
    assert _has_buttons(card)
    [request] = story.bot.services.requests(BOB)
    return request.id, card


def test_approve_on_a_settled_card_says_so_and_redraws_the_card(story: Story) -> None:
    """The card's update was given up, so it still offers buttons: a second Approve answers
    who settled it and when, and the card is redrawn without buttons."""
    request_id, card = _bob_asks(story)
    assert not isinstance(story.bot.services.deny(VICTOR, request_id, "not now"), str)
    _give_up(story, "card_settled")
    before = len(story.local.calls.of("response_url"))
    story.slack.click(ADA, card, "request_approve")
    story.local.wait_for(
        "response_url", lambda a: len(story.local.calls.of("response_url")) > before
    )
    reply = json.dumps(story.local.calls.of("response_url")[before].args)
    assert f"R{request_id} was already settled by <@{VICTOR}> at 2026-03-02 09:00 UTC" in reply
    story.pass_()
    now = story.local.messages(APPROVALS)[0]
    assert not _has_buttons(now)
    assert "Denied by" in _said(now)


def test_a_withdrawn_request_s_card_loses_its_buttons(story: Story) -> None:
    """Bob withdraws his request: the card says withdrawn, and offers nothing to click."""
    request_id, card = _bob_asks(story)
    assert not isinstance(story.bot.services.cancel(BOB, request_id), str)
    story.pass_()
    [now] = story.local.messages(APPROVALS)
    assert (card.ts, True) == (now.ts, now.edited)
    assert not _has_buttons(now)
    assert "Withdrawn by Bob Brown <!date^" in _said(now)


def test_a_waiting_card_is_redrawn_when_its_pool_s_numbers_move(story: Story) -> None:
    """Alice gives back her GPUs while Bob's request waits: the card's quota line follows
    within CARD_NUMBERS_EVERY (changes meanwhile fold into one redraw), and its buttons stay."""
    request_id, card = _bob_asks(story)
    assert "8 in use of 8 guaranteed" in _said(card)
    [alice] = story.bot.services.leases(ALICE)
    story.bot.services.release(ALICE, alice.id)
    story.pass_()
    assert "8 in use of 8 guaranteed" in _said(story.local.messages(APPROVALS)[0])  # not yet
    story.clock.tick(CARD_NUMBERS_EVERY)
    story.pass_()
    now = story.local.messages(APPROVALS)[0]
    assert "0 in use of 8 guaranteed" in _said(now)
    assert _has_buttons(now)
    assert f"R{request_id}" in now.text
