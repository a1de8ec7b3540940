"""The borrow form checked by the field as Slack does it (`response_action: errors`, nothing
filed), the deny form's required reason, and the wording people read: names, not ids; times
in the reader's zone; counts that agree; denials that restate the request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlmodel import select

from bot.localslack import Message
from storage.tables import AuditRow, RequestRow
from tests.integration.conftest import Running
from tests.integration.test_flows import answered, card, dm_text, text_of

ALICE, BOB, ERIN = "U0ALICE01", "U0BOB0001", "U0ERIN001"
VICTOR = "U0VMGR001"
GOOD = {"pool": "a100", "count": "2", "duration": "6h", "priority": "normal", "reason": "evals"}


def filed(running: Running) -> int:
    """Requests and audit rows written so far: a refused form adds neither."""
    with running.bot.db.read() as session:
        return len(session.exec(select(RequestRow)).all()) + len(
            session.exec(select(AuditRow)).all()
        )


def opened_form(running: Running, user: str) -> dict[str, Any]:
    before = len(running.local.calls.of("views.open"))
    running.slack.command(user, "borrow")
    running.local.wait_for(
        "views.open", lambda a: len(running.local.calls.of("views.open")) > before
    )
    view = running.local.calls.of("views.open")[-1].response["view"]
    assert isinstance(view, dict)
    return view


def pools_of(view: dict[str, Any]) -> list[str]:
    block = next(b for b in view["blocks"] if b.get("block_id") == "borrow_pool")
    return [o["value"] for o in block["element"]["options"]]


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("count", "", "Say how many GPUs you need, for example 2."),
        ("count", "0", "Ask for at least one GPU."),
        ("count", "1.5", "Whole GPUs only: 1, 2, 3 and so on."),
        ("count", "lots", "Type a whole number of GPUs, for example 2."),
        ("count", "100", "One request of team vision in a100 may take at most 8 GPUs."),
        ("duration", "99d", "A borrow in a100 lasts at most 3d; ask for less."),
        ("duration", "0m", "`0m` is no time at all; say e.g. `for 6h`."),
        ("duration", "soon", "I did not understand `soon`."),
        ("reason", "", "Say in a few words what the GPUs are for: your manager may read it."),
        ("reason", "x" * 2000, "At most 500 characters, please (yours has 2000)."),
    ],
)
def test_a_wrong_field_is_answered_under_it_and_nothing_is_filed(
    running: Running, field: str, value: str, error: str
) -> None:
    """The ack carries Slack's `response_action: errors` by block id; no request, no audit."""
    view = opened_form(running, ALICE)
    before = filed(running)
    reply = running.slack.submit(ALICE, view, {**GOOD, field: value})
    assert 200 == reply.status
    assert {"response_action": "errors", "errors": {f"borrow_{field}": error}} == reply.json
    running.bot.inbox.wait_idle()
    assert before == filed(running)
    assert [] == running.bot.services.requests(ALICE)


def test_the_pool_list_is_the_teams_and_a_pool_without_quota_is_an_error(
    running: Running,
) -> None:
    """Vision sees a100 and l40s; platform sees inference too. A form showing inference,
    submitted by Alice (vision), is answered by the field and files nothing."""
    assert ["a100", "l40s"] == pools_of(opened_form(running, ALICE))
    erins = opened_form(running, ERIN)
    assert ["a100", "inference", "l40s"] == pools_of(erins)
    before = filed(running)
    reply = running.slack.submit(ALICE, erins, {**GOOD, "pool": "inference"})
    assert {
        "borrow_pool": "Team vision has no quota in inference. Its pools: a100, l40s."
    } == reply.json["errors"]
    assert before == filed(running)


def test_a_good_form_borrows(running: Running) -> None:
    view = opened_form(running, ALICE)
    reply = running.slack.submit(ALICE, view, GOOD)
    assert (200, {}) == (reply.status, reply.json)
    running.local.wait_for("chat.postMessage", lambda a: "Granted" in json.dumps(a))


def asked_card(running: Running, reason: str = "sweep") -> Message:
    """Alice holds vision's 8 a100; Bob asks for 2 more, which a manager decides."""
    answered(running, ALICE, "borrow 8 a100 for 6h because evals")
    call = answered(running, BOB, f"borrow 2 a100 for 6h because {reason}")
    assert "needs approval" in text_of(call)
    running.deliver()
    return card(running)


def test_a_long_reason_is_cut_short_on_the_card_and_whole_in_why(running: Running) -> None:
    """A 450-character reason: the card shows 200 and points to `/gpu why`, which has it all."""
    reason = "a " + "very " * 89 + "long sweep"
    posted = asked_card(running, reason)
    shown = json.dumps(posted.blocks, ensure_ascii=False)
    assert reason not in shown
    assert "…" in shown
    assert "`/gpu why R2` has it all" in shown
    why = answered(running, BOB, "why R2")
    assert reason in text_of(why)


def test_a_reason_longer_than_the_limit_is_refused_in_a_slash_command(running: Running) -> None:
    call = answered(running, ALICE, "borrow 1 a100 for 2h because " + "y" * 600)
    assert "Please keep the reason to 500 characters (yours has 600)" in text_of(call)
    assert [] == running.bot.services.requests(ALICE)


def test_the_card_title_and_the_settled_line_use_names(running: Running) -> None:
    """ "GPU request R2: Bob Brown"; "Approved by Victor Vision today at …", no "@", no "at
    today at"."""
    posted = asked_card(running)
    assert "GPU request R2: Bob Brown" == posted.blocks[0]["text"]["text"]
    running.slack.click(VICTOR, posted, "request_approve")
    running.local.wait_for("response_url", lambda a: "approved" in json.dumps(a))
    running.deliver()
    update = running.local.wait_for("chat.update", lambda a: a.get("ts") == posted.ts)
    settled = json.dumps(update.args["blocks"])
    assert "Approved by Victor Vision <!date^" in settled
    assert "^{date_short_pretty} at {time}|" in settled
    assert " at <!date^" not in settled


def test_a_refusal_says_the_clicker_is_not_a_manager_of_the_team(running: Running) -> None:
    posted = asked_card(running)
    running.slack.click("U0DAVE001", posted, "request_approve")  # nlp, not vision
    refusal = running.local.wait_for("response_url", lambda a: "not a manager" in json.dumps(a))
    assert "you are not a manager of vision, so you cannot approve this" in text_of(refusal)
    assert "Times" not in text_of(refusal)  # no time-zone footer on an error


def test_deny_needs_a_reason_and_the_dm_restates_the_request(running: Running) -> None:
    """An empty reason is answered under the field; the DM names what was asked, by whom it
    was denied, and why."""
    posted = asked_card(running)
    running.slack.click(VICTOR, posted, "request_deny")
    view = running.local.wait_for("views.open").response["view"]
    empty = running.slack.submit(VICTOR, view, {"reason": ""})
    assert {"deny_reason": "Say why: the requester reads it, and it is audited."} == empty.json[
        "errors"
    ]
    assert "pending" == running.bot.services.requests(BOB)[0].state
    assert 200 == running.slack.submit(VICTOR, view, {"reason": "use l40s instead"}).status
    running.until(lambda: running.bot.services.requests(BOB) == [])
    running.deliver()
    dm = dm_text(running, BOB)
    assert "Victor Vision denied R2 (2 × a100 for 6h, because “sweep”)." in dm
    assert "*Why:* use l40s instead" in dm


def test_why_and_audit_speak_in_the_readers_zone_with_names(running: Running) -> None:
    """Alice is in Europe/Berlin: her audit trail says CET and "Alice Anders", never her id,
    under a title that says what it shows."""
    answered(running, ALICE, "borrow 2 a100 for 6h because evals")
    audit = text_of(answered(running, ALICE, "audit L1"))
    assert "Audit trail of L1" in audit
    assert "Why L1" not in audit
    assert " CET` " in audit or " CET " in audit
    assert "by Alice Anders" in audit
    assert ALICE not in audit
    assert "Times are in your time zone (Europe/Berlin)." in audit
    why = text_of(answered(running, ALICE, "why L1"))
    assert "Why L1" in why
    assert "2 a100 GPUs held by Alice Anders" in why
    assert " CET " in why
    assert "UTC" not in why.split("Reason")[-1].split("Times are")[0]
    refused = text_of(answered(running, ALICE, "why L99"))
    assert "There is no lease L99." in refused
    assert "time zone" not in refused


def test_the_first_extension_is_extension_1_of_2(running: Running) -> None:
    answered(running, ALICE, "borrow 2 a100 for 6h because evals")
    reply = text_of(answered(running, ALICE, "extend L1 +2h"))
    assert "extension 1 of 2, within the limits" in reply
