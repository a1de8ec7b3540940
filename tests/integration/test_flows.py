"""The whole story through signed HTTP: borrow, ask, approve, DM; deny with a reason; refused
clicks; forged requests; the Home tab; help for what could not be read."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from sqlmodel import col, select

from bot.localslack import Message
from storage.tables import ApprovalRow, AuditRow, LeaseRow
from tests.integration.conftest import Running

ALICE, BOB, CAROL = "U0ALICE01", "U0BOB0001", "U0CAROL01"
VICTOR, ADA = "U0VMGR001", "U0ADMIN01"
APPROVALS = "C0VAPPROV"


def answered(running: Running, user: str, text: str) -> Any:
    """Type `/gpu text` and return what the bot answered later through response_url."""
    before = len(running.local.calls.of("response_url"))
    reply = running.slack.command(user, text)
    assert 200 == reply.status
    running.local.wait_for(
        "response_url", lambda a: len(running.local.calls.of("response_url")) > before
    )
    return running.local.calls.of("response_url")[before]


def text_of(call: Any) -> str:
    return json.dumps(call.args)


def dm_text(running: Running, user: str) -> str:
    channel = running.local.dm_channel(user)
    return "\n".join(json.dumps(m.blocks) + m.text for m in running.local.messages(channel))


def card(running: Running) -> Message:
    messages = running.local.messages(APPROVALS)
    assert messages, "no approval card was posted"
    return messages[-1]


def test_a_borrow_inside_quota_is_granted_with_a_dm(running: Running) -> None:
    """The ephemeral says granted; the DM has host, GPUs, CUDA_VISIBLE_DEVICES and expiry."""
    call = answered(running, ALICE, "borrow 2 a100 for 6h because ablations")
    assert "Granted" in text_of(call)
    running.deliver()
    dm = dm_text(running, ALICE)
    assert "CUDA_VISIBLE_DEVICES=0,1" in dm
    assert "<!date^" in dm
    assert "lease_extend" in dm
    assert "lease_release" in dm
    assert [] == running.local.violations


def test_a_command_that_mentions_payload_is_still_a_command(running: Running) -> None:
    """Over signed HTTP: Bolt alone would take any form body containing "payload" for an
    interaction and leave the command unanswered."""
    call = answered(running, ALICE, "borrow 1 a100 for 2h because payload tests")
    assert "Granted" in text_of(call)
    assert "payload tests" in json.dumps(running.bot.services.leases(ALICE)[0].reason)


def test_ask_then_the_manager_approves_and_the_card_updates_in_place(running: Running) -> None:
    """Over nominal: a card with buttons in the approval channel; Approve grants and DMs."""
    answered(running, ALICE, "borrow 8 a100 for 6h")
    call = answered(running, BOB, "borrow 2 a100 for 4h because sweep")
    assert "needs approval" in text_of(call)
    running.deliver()
    posted = card(running)
    assert "request_approve" in json.dumps(posted.blocks)
    running.slack.click(VICTOR, posted, "request_approve")
    running.local.wait_for("response_url", lambda a: "approved" in json.dumps(a))
    running.deliver()
    update = running.local.wait_for("chat.update", lambda a: a.get("ts") == posted.ts)
    assert "request_approve" not in json.dumps(update.args["blocks"])
    assert "Approved by Victor Vision <!date^" in json.dumps(update.args["blocks"])
    assert "CUDA_VISIBLE_DEVICES=" in dm_text(running, BOB)
    assert [] == running.local.violations


def test_deny_asks_for_a_reason_and_tells_the_requester(running: Running) -> None:
    """Deny opens a modal; the reason reaches the card and the requester's DM."""
    answered(running, ALICE, "borrow 8 a100")
    answered(running, BOB, "borrow 2 a100")
    running.deliver()
    posted = card(running)
    running.slack.click(VICTOR, posted, "request_deny")
    opened = running.local.wait_for("views.open")
    view = opened.response["view"]
    assert "deny_modal" == view["callback_id"]
    assert 200 == running.slack.submit(VICTOR, view, {"reason": "use l40s instead"}).status
    running.until(lambda: running.bot.services.requests(BOB) == [])  # settled after the ack
    running.deliver()
    update = running.local.wait_for("chat.update", lambda a: a.get("ts") == posted.ts)
    assert "use l40s instead" in json.dumps(update.args["blocks"])
    assert "request_deny" not in json.dumps(update.args["blocks"])
    assert "use l40s instead" in dm_text(running, BOB)


def test_a_click_by_someone_who_may_not_approve_is_refused_and_audited(running: Running) -> None:
    """An nlp member clicking a vision card: an ephemeral no, an audit row, the card unchanged."""
    answered(running, ALICE, "borrow 8 a100")
    answered(running, BOB, "borrow 2 a100")
    running.deliver()
    posted = card(running)
    running.slack.click(CAROL, posted, "request_approve")
    refusal = running.local.wait_for(
        "response_url", lambda a: "may not approve or deny" in json.dumps(a)
    )
    assert "ephemeral" == refusal.args.get("response_type")
    running.slack.click(BOB, posted, "request_approve")
    running.local.wait_for("response_url", lambda a: "their own request" in json.dumps(a))
    with running.bot.db.read() as session:
        tags = session.exec(select(AuditRow.tag).order_by(col(AuditRow.id))).all()
    assert 2 == tags.count("approval:refused")
    running.deliver()
    assert [] == running.local.calls.of("chat.update")


def test_fifty_concurrent_clicks_make_exactly_one_decision(running: Running) -> None:
    """Double clicks and two approvers racing: one approval, one lease, one card update."""
    answered(running, ALICE, "borrow 8 a100")
    answered(running, BOB, "borrow 2 a100")
    running.deliver()
    posted = card(running)
    before = len(running.local.calls.of("response_url"))
    start = threading.Barrier(50)

    def click(n: int) -> None:
        start.wait()
        running.slack.click(VICTOR if n % 2 else ADA, posted, "request_approve")

    threads = [threading.Thread(target=click, args=(n,)) for n in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    running.local.wait_for(
        "response_url",
        lambda a: len(running.local.calls.of("response_url")) >= before + 50,
        timeout=30,
    )
    with running.bot.db.read() as session:
        approvals = session.exec(select(ApprovalRow)).all()
        leases = session.exec(select(LeaseRow).where(LeaseRow.holder == BOB)).all()
    assert 1 == len(approvals)
    assert 1 == len(leases)
    running.deliver()
    assert 1 == len([c for c in running.local.calls.of("chat.update") if c.args["ts"] == posted.ts])


def test_forged_signatures_and_stale_timestamps_are_answered_401(running: Running) -> None:
    """Signature verification is always on."""
    assert 401 == running.slack.command(ALICE, "status", forge="signature").status
    assert 401 == running.slack.command(ALICE, "status", forge="timestamp").status
    assert [] == running.local.calls.of("response_url")


def test_the_home_tab_shows_my_leases_and_pools(running: Running) -> None:
    """Opening the app publishes the Home view with what the person holds."""
    answered(running, ALICE, "borrow 2 a100 for 6h")
    running.slack.open_home(ALICE)
    published = running.local.wait_for("views.publish", lambda a: a["user_id"] == ALICE)
    view = json.dumps(published.args["view"])
    assert "L1" in view
    assert "a100" in view
    assert running.local.home(ALICE) is not None


def test_text_that_cannot_be_read_gets_a_helpful_reply_at_once(running: Running) -> None:
    """The ack itself says what was understood and gives an example; nothing is recorded."""
    reply = running.slack.command(ALICE, "borow 2 a100")
    assert 200 == reply.status
    assert reply.text is not None
    assert "borrow" in reply.text
    reply = running.slack.command(ALICE, "borrow 2 a100 fo 6h")
    assert reply.text is not None
    assert "I understood: 2 GPUs, pool a100" in reply.text
    assert "Try:" in reply.text
    with running.bot.db.read() as session:
        assert [] == session.exec(select(LeaseRow)).all()


def test_borrow_without_words_opens_the_form_and_the_form_borrows(running: Running) -> None:
    """`/gpu borrow` opens the modal; submitting it decides and DMs the result."""
    running.slack.command(ALICE, "borrow")
    opened = running.local.wait_for("views.open")
    view = opened.response["view"]
    assert "borrow_modal" == view["callback_id"]
    values = {
        "pool": "l40s",
        "count": "2",
        "duration": "3h",
        "priority": "normal",
        "reason": "eval run",
    }
    reply = running.slack.submit(ALICE, view, values)
    assert 200 == reply.status
    running.local.wait_for("chat.postMessage", lambda a: "Granted" in json.dumps(a))


def test_healthz_reports_the_rules_and_the_database(running: Running) -> None:
    """/healthz answers 200 with what is in force."""
    with urllib.request.urlopen(running.url + "/healthz", timeout=5) as answer:  # noqa: S310
        report = json.loads(answer.read())
    assert report["ok"]
    assert running.bot.services.policy.revision == report["rules_revision"]
    assert ("ok", "sqlite") == (report["database"], report["database_kind"])


def test_a_click_on_the_home_tab_is_answered_by_dm_and_the_home_redrawn(running: Running) -> None:
    """Home-tab buttons carry no response_url: the answer comes by DM, the Home is redrawn."""
    answered(running, ALICE, "borrow 2 a100 for 6h")
    running.slack.open_home(ALICE)
    running.deliver()
    home = running.local.home(ALICE)
    assert home is not None

    def alices() -> int:
        return len(
            [c for c in running.local.calls.of("views.publish") if c.args["user_id"] == ALICE]
        )

    published = alices()
    running.slack.click(ALICE, home, "lease_extend", block_id="lease:1")
    running.deliver()
    assert alices() > published
    assert "L1 now ends" in dm_text(running, ALICE)
