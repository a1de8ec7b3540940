"""A warning that no longer stands is redrawn in place without its buttons, saying what became
of it (given back, extended, snoozed, kept, superseded), once; an ended lease's warnings show
its end instead."""

from __future__ import annotations

import json
from datetime import timedelta

from bot.localslack import Message
from bot.services.results import BorrowResult
from bot.slack.blocks.warnings import GIVE_BACK_IDLE_ACTION, KEEP_ALL_ACTION, SNOOZE_ACTION
from tests.integration.story import ALICE, ERIN, Story, busy
from tests.integration.test_partly_idle import _borrow, _run_on_one_gpu
from tests.integration.test_recall import CAROL, DAVE, alice_asks, lend_out

BOB, VICTOR = "U0BOB0001", "U0VMGR001"


def _warnings(story: Story, user: str, title: str) -> list[Message]:
    """The replies in `user`'s DM whose text starts with `title`, as they read now."""
    dm = story.local.dm_channel(user)
    return [m for m in story.local.messages(dm) if m.is_reply and m.text.startswith(title)]


def _now(story: Story, user: str, warning: Message) -> Message:
    """`warning` as it reads now."""
    found = story.local.workspace.message(story.local.dm_channel(user), warning.ts)
    assert found is not None
    return found


def _updates_of(story: Story, ts: str) -> int:
    return sum(1 for c in story.local.calls.of("chat.update") if c.args.get("ts") == ts)


def _settle(story: Story) -> None:
    """Past the grant's redraw interval, and the redraws delivered."""
    story.clock.tick(timedelta(seconds=5))
    story.pass_()


def _partly_idle_warning(story: Story) -> tuple[int, Message]:
    result: BorrowResult = _borrow(story, ALICE, 4)
    assert result.lease is not None
    _run_on_one_gpu(story, result.lease.id, 95)
    [warning] = _warnings(story, ALICE, f"L{result.lease.id}: 3 of 4 GPUs idle")
    assert GIVE_BACK_IDLE_ACTION in json.dumps(warning.blocks)
    return result.lease.id, warning


def test_give_back_redraws_the_partly_idle_warning_without_buttons(story: Story) -> None:
    """After Give back the warning says what was given back and what the lease keeps, with no
    buttons left to click; a later change to the lease does not redraw it again."""
    lease, warning = _partly_idle_warning(story)
    story.click_in_dm(ALICE, GIVE_BACK_IDLE_ACTION)
    _settle(story)
    now = _now(story, ALICE, warning)
    shown = json.dumps(now.blocks)
    assert '"actions"' not in shown
    assert "You gave back 3 GPUs" in shown
    assert f"L{lease} keeps" in shown
    assert 1 == _updates_of(story, warning.ts)
    extended = story.bot.services.extend(ALICE, lease, timedelta(hours=1), "more")
    assert not isinstance(extended, str)
    _settle(story)
    grant = story.local.messages(story.local.dm_channel(ALICE))[0]
    assert 3 == _updates_of(story, grant.ts)  # the grant was redrawn after the extension
    assert 1 == _updates_of(story, warning.ts)
    assert [] == story.local.violations


def test_keep_redraws_the_partly_idle_warning(story: Story) -> None:
    """Keep: the warning says every GPU stays."""
    _, warning = _partly_idle_warning(story)
    story.click_in_dm(ALICE, KEEP_ALL_ACTION)
    _settle(story)
    now = _now(story, ALICE, warning)
    assert "You chose to keep all 4 GPUs" in json.dumps(now.blocks)
    assert '"actions"' not in json.dumps(now.blocks)


def test_still_using_redraws_the_partly_idle_warning_as_snoozed(story: Story) -> None:
    """Still using: the warning says until when no idle warning comes."""
    _, warning = _partly_idle_warning(story)
    story.click_in_dm(ALICE, SNOOZE_ACTION)
    _settle(story)
    now = _now(story, ALICE, warning)
    shown = json.dumps(now.blocks)
    assert "Snoozed: no idle warnings until <!date^" in shown
    assert '"actions"' not in shown


def _extended_by_victor(story: Story) -> tuple[int, Message]:
    """Bob's 2-hour lease warned of its end at T-60; Victor approves 2 hours more."""
    story.borrow(ALICE, "a100", 8, hours=6)
    lease = story.borrow(BOB, "a100", 2, hours=2)
    story.run(61, busy, lease=lease)
    [warning] = _warnings(story, BOB, f"L{lease} ends soon")
    assert "lease_extend" in json.dumps(warning.blocks)
    asked = story.bot.services.extend(BOB, lease, timedelta(hours=2), "longer run")
    request = getattr(asked, "request", None)
    assert request is not None
    story.pass_()
    settled = story.bot.services.approve(VICTOR, request.id)
    assert not isinstance(settled, str)
    _settle(story)
    return lease, warning


def test_an_approved_extension_redraws_the_expiry_warning(story: Story) -> None:
    """The expiry warning shows the new end and whose approval, and no Extend/Release."""
    _, warning = _extended_by_victor(story)
    now = _now(story, BOB, warning)
    shown = json.dumps(now.blocks)
    assert "Extended to <!date^" in shown
    assert "by Victor" in shown
    assert "lease_extend" not in shown
    assert "lease_release" not in shown
    assert [] == story.local.violations


def test_an_ended_lease_s_warning_shows_its_end_not_the_settled_state(story: Story) -> None:
    """Extended, then released: the warning shows the end of the lease."""
    lease, warning = _extended_by_victor(story)
    released = story.bot.services.release(BOB, lease)
    assert not isinstance(released, str)
    _settle(story)
    now = _now(story, BOB, warning)
    assert now.text.startswith(f"L{lease} ended")
    assert "Extended to" not in json.dumps(now.blocks)


def test_a_newer_expiry_warning_supersedes_the_first(story: Story) -> None:
    """T-10 replaces T-60: the first says so and loses its buttons; the newest keeps them."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.run(61, busy, lease=lease)
    [first] = _warnings(story, ALICE, f"L{lease} ends soon")
    story.run(112, busy, lease=lease)
    _settle(story)
    first_now, second = _warnings(story, ALICE, f"L{lease} ends soon")
    assert first.ts == first_now.ts
    assert "Superseded by the warning below" in json.dumps(first_now.blocks)
    assert "lease_extend" not in json.dumps(first_now.blocks)
    assert "lease_extend" in json.dumps(second.blocks)


def test_a_withdrawn_recall_redraws_the_preemption_warning(story: Story) -> None:
    """The recall is no longer needed: its warning says so and offers no Release now."""
    leases = lend_out(story)
    story.run(70, busy, lease=list(leases.values()))
    alice_asks(story)
    story.run(72, busy, lease=list(leases.values()))
    [warning] = _warnings(story, DAVE, f"L{leases[DAVE]} is recalled")
    assert "lease_release" in json.dumps(warning.blocks)
    story.bot.services.release(CAROL, leases[CAROL])
    story.run(75, busy, lease=[leases[DAVE], leases[ERIN]])
    now = _now(story, DAVE, warning)
    assert "The recall was withdrawn" in json.dumps(now.blocks)
    assert "lease_release" not in json.dumps(now.blocks)
