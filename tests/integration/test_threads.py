"""One thread per lease: the grant DM is the lease's home, what happens to the lease arrives as
replies in its thread (only the first warning broadcast), and the grant is redrawn in place;
admin notices come as one digest per sweep, updated in place while it is the newest."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from slack_sdk import WebClient
from sqlmodel import col, select

from bot.localslack import BOT_TOKEN, Message
from bot.services import notice_views, notices
from storage import outbox
from storage.tables import OutboxRow
from tests.integration.story import ADA, ALICE, Story, busy

BOB = "U0BOB0001"


def _said(message: Message) -> str:
    return message.text + json.dumps(message.blocks)


def _web(story: Story) -> WebClient:
    return WebClient(token=BOT_TOKEN, base_url=story.local.api_url)


def _rows(story: Story, kind: str) -> list[OutboxRow]:
    with story.bot.db.read() as session:
        stmt = select(OutboxRow).where(OutboxRow.kind == kind).order_by(col(OutboxRow.id))
        return list(session.exec(stmt).all())


def _posts(story: Story, channel: str) -> list[dict[str, Any]]:
    return [
        c.args
        for c in story.local.calls.of("chat.postMessage")
        if c.args.get("channel") == channel and not c.faulted
    ]


def test_a_lease_s_warnings_and_its_end_are_replies_in_its_grant_s_thread(story: Story) -> None:
    """T-60 and T-10 and the reclaim are replies under the grant DM; only the first warning is
    broadcast; the DM's history shows the grant (three replies) and that broadcast only; the
    grant is redrawn in place, first with the warning sent, last as ended."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.run(61, busy, lease=lease)
    dm = story.local.dm_channel(ALICE)
    grant = story.local.messages(dm)[0]
    assert "lease_extend" in json.dumps(grant.blocks)
    shown = story.local.workspace.message(dm, grant.ts)
    assert shown is not None
    assert "a warning that it ends soon sent" in _said(shown)
    story.run(160, busy, lease=lease)
    assert "reclaimed" == story.state(lease)
    thread = _web(story).conversations_replies(channel=dm, ts=grant.ts)["messages"]
    texts = [m["text"] for m in thread]
    assert 4 == len(texts), texts
    posted = _posts(story, dm)
    assert [grant.ts] * 3 == [p.get("thread_ts") for p in posted[1:]]
    assert posted[1]["text"].startswith(f"L{lease} ends soon: Your lease L{lease} ends")
    assert posted[2]["text"].startswith(f"L{lease} ends soon")
    assert "was reclaimed" in posted[3]["text"]
    assert posted[3]["text"] == texts[3]
    assert [True, False, False] == [bool(p.get("reply_broadcast")) for p in posted[1:]]
    history = _web(story).conversations_history(channel=dm)["messages"]
    assert [texts[1], texts[0]] == [m["text"] for m in history]
    assert (3, thread[-1]["ts"]) == (history[1]["reply_count"], history[1]["latest_reply"])
    assert texts[0].startswith(f"L{lease} ended")  # the parent, redrawn as it ended
    assert "lease_extend" not in json.dumps(thread[0].get("blocks"))
    assert [] == story.local.violations


def test_a_warning_says_its_reason_once(story: Story) -> None:
    """No second line restating the rule's reason ("lease 8 ends in 59m")."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.run(61, busy, lease=lease)
    [warning] = [m for m in story.local.messages(story.local.dm_channel(ALICE)) if m.is_reply]
    assert f"lease {lease} ends in" not in _said(warning)
    assert 1 == _said(warning).count("ends <!date")


def test_a_warning_owed_before_the_grant_landed_waits_and_joins_its_thread(
    story: Story,
) -> None:
    """Slack refuses messages while a 1-hour lease is granted and warned at once: nothing is
    posted before the grant; once Slack is back, the grant lands first and the warning is a
    reply in its thread."""
    story.local.faults.add("chat.postMessage", status=500, times=10_000)
    lease = story.borrow(ALICE, "a100", 1, hours=1)
    story.run(1, busy, lease=lease)
    assert [(1, "warn expiry")] == [(m, e) for m, e in story.events if e.startswith("warn")]
    tried = [c.args for c in story.local.calls.of("chat.postMessage")]
    assert not any(a.get("thread_ts") for a in tried)  # the warning waited for its parent
    story.local.faults.clear()
    story.clock.tick(timedelta(minutes=10))
    story.pass_()
    dm = story.local.dm_channel(ALICE)
    grant, warning = story.local.messages(dm)[:2]
    assert (grant.ts, True) == (warning.thread_ts, warning.reply_broadcast)
    assert f"L{lease} ends soon" in warning.text


def test_a_warning_whose_grant_never_landed_is_posted_on_its_own(story: Story) -> None:
    """A grant given up on leaves no thread: the warning is a message of its own."""
    story.local.faults.add("chat.postMessage", status=500, times=10_000)
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.pass_()
    [grant] = _rows(story, "lease_granted")
    with story.bot.db.write() as session:
        assert grant.id is not None
        outbox.dropped(session, grant.id, at=story.bot.services.now(), why="test: given up")
    story.local.faults.clear()
    story.run(61, busy, lease=lease)
    [warning] = story.local.messages(story.local.dm_channel(ALICE))
    assert warning.thread_ts is None
    assert warning.text.startswith(f"L{lease} ends soon")


def test_a_settled_extension_is_told_in_its_lease_s_thread(story: Story) -> None:
    """Bob asks to extend beyond his team's share; Victor approves: Bob hears in the thread of
    his grant, whose parent now says it was extended."""
    story.borrow(ALICE, "a100", 8, hours=6)
    lease = story.borrow(BOB, "a100", 2, hours=6)
    story.pass_()
    asked = story.bot.services.extend(BOB, lease, timedelta(hours=2), "longer run")
    request = getattr(asked, "request", None)
    assert request is not None
    story.pass_()
    settled = story.bot.services.approve("U0VMGR001", request.id)
    assert not isinstance(settled, str)
    story.clock.tick(timedelta(seconds=5))
    story.pass_()
    dm = story.local.dm_channel(BOB)
    grant = story.local.messages(dm)[0]
    [told] = [m for m in story.local.messages(dm) if m.is_reply]
    assert grant.ts == told.thread_ts
    assert f"approved R{request.id}" in told.text
    assert "extended once by 2h" in _said(grant)


def test_a_thread_reply_in_doubt_is_found_in_its_thread_not_posted_twice(story: Story) -> None:
    """A warning whose send was left in doubt is looked up with conversations.replies."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.run(61, busy, lease=lease)
    [warning] = _rows(story, "lease_warning")
    with story.bot.db.write() as session:  # as if killed between Slack's answer and the record
        row = session.get(OutboxRow, warning.id)
        assert row is not None
        row.state, row.claimed_by, row.channel, row.ts = "sending", "gone", None, None
        row.next_attempt_at = story.bot.services.now()
        session.add(row)
    story.pass_()
    [again] = _rows(story, "lease_warning")
    dm = story.local.dm_channel(ALICE)
    replies = [m for m in story.local.messages(dm) if m.is_reply]
    assert ("delivered", [again.ts]) == (again.state, [m.ts for m in replies])
    assert story.local.calls.of("conversations.replies")


def _tell_admins(story: Story, *lines: str) -> None:
    with story.bot.db.write() as session:
        for line in lines:
            notices.tell_admins(session, [ADA], "test", line, at=story.bot.services.now())


def _deliver_digests(story: Story) -> None:
    story.clock.tick(notices.DIGEST_WAIT + timedelta(seconds=1))
    story.bot.deliverer.deliver_due()


def test_admin_notices_of_a_sweep_are_one_digest_updated_in_place(story: Story) -> None:
    """Two lines, one message; the next sweep's line updates that message while it is Ada's
    newest; after another message from the bot, the next lines start a new digest."""
    dm = story.local.dm_channel(ADA)
    _tell_admins(story, "node-1 GPU 0 is out of service", "1 processes run on node-2 GPU 1")
    _deliver_digests(story)
    [digest] = story.local.messages(dm)
    assert "node-1 GPU 0 is out of service" in _said(digest)
    assert "1 process runs on node-2 GPU 1" in _said(digest)
    assert "1 processes" not in _said(digest)
    story.clock.tick(timedelta(minutes=1))
    _tell_admins(story, "node-3 has sent no telemetry")
    _deliver_digests(story)
    [updated] = story.local.messages(dm)
    assert (digest.ts, True) == (updated.ts, updated.edited)
    assert "3 notices for admins" in _said(updated)
    assert "node-1 GPU 0" in _said(updated)
    assert "node-3 has sent" in _said(updated)
    assert 1 == len(_posts(story, dm))
    with story.bot.db.write() as session:
        notices.tell(session, ADA, "test", "something else", at=story.bot.services.now())
    story.bot.deliverer.deliver_due()
    _tell_admins(story, "node-4 reports again")
    _deliver_digests(story)
    newest = story.local.messages(dm)[-1]
    assert 3 == len(story.local.messages(dm))
    assert "node-4 reports again" in _said(newest)
    assert "node-1" not in _said(newest)
    assert [] == story.local.violations


def test_a_digest_edited_for_many_sweeps_gives_way_to_a_new_one(story: Story) -> None:
    """An edit does not notify: after DIGEST_UPDATES sweeps a new digest message starts."""
    dm = story.local.dm_channel(ADA)
    for sweep in range(notice_views.DIGEST_UPDATES + 1):
        _tell_admins(story, f"sweep {sweep}: node-1 has sent no telemetry")
        _deliver_digests(story)
    first, second = story.local.messages(dm)
    assert f"{notice_views.DIGEST_UPDATES} notices for admins" in _said(first)
    assert f"sweep {notice_views.DIGEST_UPDATES}:" in _said(second)
    assert "sweep 0:" not in _said(second)


def test_a_reply_whose_grant_was_deleted_is_posted_on_its_own(story: Story) -> None:
    """Someone deleted the grant DM: Slack answers thread_not_found and the warning is posted
    as a message of its own rather than retried in vain."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.pass_()
    dm = story.local.dm_channel(ALICE)
    [grant] = story.local.messages(dm)
    assert story.local.workspace.delete(dm, grant.ts)
    story.run(61, busy, lease=lease)
    [warning] = story.local.messages(dm)
    assert warning.thread_ts is None
    assert warning.text.startswith(f"L{lease} ends soon")
    assert "delivered" == _rows(story, "lease_warning")[0].state


def test_a_digest_whose_message_was_deleted_is_posted_anew_and_grown_after(story: Story) -> None:
    """Ada deleted her digest: the next lines cannot update it (message_not_found), so they
    are posted as a new digest with all it says, and later lines grow that one."""
    dm = story.local.dm_channel(ADA)
    _tell_admins(story, "node-1 GPU 0 is out of service")
    _deliver_digests(story)
    [digest] = story.local.messages(dm)
    assert story.local.workspace.delete(dm, digest.ts)
    story.clock.tick(timedelta(minutes=1))
    _tell_admins(story, "node-3 has sent no telemetry")
    _deliver_digests(story)
    [anew] = story.local.messages(dm)
    assert "node-1 GPU 0" in _said(anew)
    assert "node-3 has sent" in _said(anew)
    story.clock.tick(timedelta(minutes=1))
    _tell_admins(story, "node-4 reports again")
    _deliver_digests(story)
    [grown] = story.local.messages(dm)
    assert (anew.ts, True) == (grown.ts, grown.edited)
    assert "node-4 reports again" in _said(grown)
    assert ["delivered"] * 3 == [r.state for r in _rows(story, "admin_digest")]


def test_a_notice_about_a_lease_to_someone_else_does_not_wait_for_its_grant(
    story: Story,
) -> None:
    """Only the holder's messages wait for the holder's grant DM to land: Bob's notice about
    Alice's lease goes out at once, on its own."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.bot.deliverer.idle()
    [grant] = _rows(story, "lease_granted")
    now = story.bot.services.now()
    with story.bot.db.write() as session:  # the grant is still on its way
        row = session.get(OutboxRow, grant.id)
        assert row is not None
        row.state, row.channel, row.ts = "pending", None, None
        row.next_attempt_at = now + timedelta(hours=1)
        session.add(row)
        notices.tell(session, BOB, f"lease:{lease}", "Alice's job runs on your GPU", at=now)
    story.bot.deliverer.deliver_due()
    [told] = story.local.messages(story.local.dm_channel(BOB))
    assert told.thread_ts is None
    assert "Alice's job runs on your GPU" in _said(told)


def test_a_line_added_while_its_digest_is_being_sent_is_not_lost(story: Story) -> None:
    """A long sweep (its lines stamped with its start) adds a line to a digest a deliverer
    has already read: the line is in what Ada sees, in that digest or the next."""
    dm = story.local.dm_channel(ADA)
    started = story.bot.services.now()
    _tell_admins(story, "node-1 GPU 0 is out of service")
    render = story.bot.deliverer.render
    late: list[str] = []

    def render_and_grow(row: OutboxRow) -> Any:
        drawn = render(row)
        if row.kind == "admin_digest" and not late:
            late.append("node-9 has sent no telemetry")
            with story.bot.db.write() as session:
                notices.tell_admins(session, [ADA], "test", late[0], at=started)
        return drawn

    story.bot.deliverer.render = render_and_grow
    _deliver_digests(story)
    _deliver_digests(story)
    shown = " ".join(_said(m) for m in story.local.messages(dm))
    assert late == ["node-9 has sent no telemetry"]
    assert "node-1 GPU 0" in shown
    assert "node-9 has sent" in shown


def _redraw_then(story: Story, act: Any) -> None:
    """The next grant redraw is drawn, then `act` commits, then the drawing is sent."""
    render = story.bot.deliverer.render
    done: list[bool] = []

    def draw_then_act(row: OutboxRow) -> Any:
        drawn = render(row)
        if row.kind == "lease_redrawn" and not done:
            done.append(True)
            act()
        return drawn

    story.bot.deliverer.render = draw_then_act


def test_an_extension_while_the_grant_is_redrawn_is_shown_on_the_grant(story: Story) -> None:
    """Alice extends while her grant's redraw is on its way: the grant ends up showing the
    extension, not the drawing made before it."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.run(61, busy, lease=lease)
    dm = story.local.dm_channel(ALICE)
    grant = story.local.messages(dm)[0]
    with story.bot.db.write() as session:
        notices.lease_changed(session, lease, ALICE, at=story.bot.services.now())
    extended: list[object] = []
    _redraw_then(
        story,
        lambda: extended.append(story.bot.services.extend(ALICE, lease, timedelta(hours=1))),
    )
    for _ in range(3):
        story.clock.tick(timedelta(seconds=10))
        story.pass_()
    assert 1 == len(extended)
    shown = story.local.workspace.message(dm, grant.ts)
    assert shown is not None
    assert "extended once by 1h" in _said(shown)


def test_a_lease_ended_while_its_grant_is_redrawn_keeps_no_buttons(story: Story) -> None:
    """Alice releases while her grant's redraw (still active) is on its way: the grant ends
    up showing the end, without Extend or Release."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    story.pass_()
    dm = story.local.dm_channel(ALICE)
    [grant] = story.local.messages(dm)
    with story.bot.db.write() as session:
        notices.lease_changed(session, lease, ALICE, at=story.bot.services.now())

    def release_and_close() -> None:
        story.bot.services.release(ALICE, lease)
        story.bot.deliverer.deliver(r.id for r in _rows(story, "lease_closed") if r.id)

    _redraw_then(story, release_and_close)
    for _ in range(3):
        story.clock.tick(timedelta(seconds=10))
        story.pass_()
    assert "released" == story.state(lease)
    shown = story.local.workspace.message(dm, grant.ts)
    assert shown is not None
    assert "lease_extend" not in json.dumps(shown.blocks)
    assert "lease_release" not in json.dumps(shown.blocks)


def test_a_long_sweep_s_line_does_not_grow_a_digest_already_due(story: Story) -> None:
    """A line stamped with its sweep's start but told once the digest is due starts a new
    digest: the margin is measured from the clock, not from the sweep's start."""
    started = story.bot.services.now()
    _tell_admins(story, "node-1 GPU 0 is out of service")
    story.clock.tick(notices.DIGEST_WAIT)
    with story.bot.db.write() as session:
        now = story.bot.services.now()
        notices.tell_admins(session, [ADA], "test", "node-9 is silent", at=started, now=now)
    assert [1, 1] == [len(r.data["lines"]) for r in _rows(story, "admin_digest")]
