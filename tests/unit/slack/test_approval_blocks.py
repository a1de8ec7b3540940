"""The approval lifecycle's messages: reminders in a card's thread and by DM, the escalation
mark, an expired card, a pending extension's DM and the answers to *Remind approvers*; each
validates, stays within Slack's limits and says what happens in people's words."""

from __future__ import annotations

from datetime import timedelta

from bot.slack.blocks.approval import (
    approval_reminder,
    escalated_line,
    extension_waiting,
    nudge_reply,
    settled_card,
)
from tests.unit.slack.builders import (
    ALICE,
    T0,
    VICTOR,
    a_request,
    assert_within_limits,
    texts_of,
)

ADA = "U0ADMIN01"


def test_a_reminder_in_the_thread_names_who_is_waited_for_and_since_when() -> None:
    shown = approval_reminder(
        a_request(), "Alice Archer", (VICTOR,), timedelta(minutes=150), in_thread=True
    )
    assert_within_limits(shown)
    text = texts_of(shown)
    assert f"Still waiting for you, <@{VICTOR}>:" in text
    assert "Alice Archer asks for 2 GPUs in a100 for 6h (R12), filed 2h 30m ago." in text
    assert "on the card above" in text
    assert ALICE not in shown.text  # her name, never her id


def test_a_reminder_by_dm_points_at_the_card_and_says_who_asked_for_it() -> None:
    shown = approval_reminder(
        a_request(approval_route="C0VAPPROV"),
        "Alice Archer",
        (VICTOR, ADA),
        timedelta(minutes=31),
        in_thread=False,
        by=ALICE,
    )
    assert_within_limits(shown)
    text = texts_of(shown)
    assert text.startswith("Alice Archer asked me to remind you. ")
    assert f"<@{VICTOR}> and <@{ADA}>" in text
    assert "on its card in <#C0VAPPROV>" in text


def test_the_escalation_mark_names_people_and_channels() -> None:
    line = escalated_line((ADA, "C0ESCAL01"), timedelta(hours=4, seconds=20))
    assert f"Escalated to <@{ADA}> and <#C0ESCAL01> after 4h." in line


def test_the_escalation_mark_says_the_admins_settle_from_a_channel() -> None:
    line = escalated_line(("C0ESCAL01",), timedelta(hours=4))
    assert "Escalated to <#C0ESCAL01> after 4h. In <#C0ESCAL01>, the gpubot admins" in line
    assert "admins" not in escalated_line((ADA,), timedelta(hours=4))


def test_an_expired_card_says_nobody_decided_and_has_no_buttons() -> None:
    request = a_request(state="cancelled", decided_by="gpubot", decided_at=T0)
    shown = settled_card(
        request, "Alice Archer", note="Expired after 1d, nobody decided", by_bot=True
    )
    assert_within_limits(shown)
    assert "Expired after 1d, nobody decided. Withdrawn <!date^" in texts_of(shown)
    assert "button" not in str(shown.blocks)
    assert "<@gpubot>" not in texts_of(shown)


def test_a_pending_extension_dm_says_when_the_lease_ends_unless_approved() -> None:
    extension = a_request(kind="extend", lease_id=7, duration=timedelta(hours=2))
    shown = extension_waiting(extension, (VICTOR,), T0 + timedelta(hours=6))
    assert_within_limits(shown)
    assert (
        f"Your extension request R12 (+2h for L7) is still waiting for <@{VICTOR}>; L7 ends at "
        "<!date^1772463600^{time}|2026-03-02 15:00 UTC> unless it is approved before then."
    ) in texts_of(shown)


def test_remind_approvers_answers_done_or_when_it_works_again() -> None:
    done = nudge_reply(a_request(), (VICTOR,), again_at=T0 + timedelta(minutes=15), ago=None)
    assert f"Reminded <@{VICTOR}> about R12. You can remind them again at <!date^" in done.text
    soon = nudge_reply(
        a_request(), (), again_at=T0 + timedelta(minutes=15), ago=timedelta(minutes=5, seconds=9)
    )
    assert_within_limits(soon)
    assert soon.text.startswith("You reminded them 5 min ago; you can again at <!date^")
