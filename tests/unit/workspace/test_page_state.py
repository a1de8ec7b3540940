"""The page's state and routes without a browser: fast-forward on a thread of its own, modals
closed when a window goes, unread counts, and threads as Slack shows them."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from bot.localslack import BOT_TOKEN
from bot.workspace.demo import Demo, ForwardBusyError
from bot.workspace.page import PageServer
from bot.workspace.state import page_state
from tests.unit.workspace.test_demo import call

ALICE, BOB = "U0ALICE01", "U0BOB0001"


def test_fast_forward_answers_before_the_time_has_moved_and_reports_when_done(
    demo: Demo, page: PageServer
) -> None:
    """While the clock is held the answer still comes, with the job's number and its progress;
    a second fast-forward meanwhile is refused; the sweeps then run as before."""
    with demo._time:  # the lock the jobs and every step of a fast-forward take
        status, answer = call(page, "/ui/forward", {"minutes": 20})
        assert (200, {"ok": True, "job": 1}) == (status, answer)
        _, state = call(page, f"/ui/state?as={ALICE}")
        assert [0, 40] == state["clock"]["forwarding"]
        assert 0 == state["clock"]["forwards_done"]
        status, refused = call(page, "/ui/forward", {"minutes": 10})
        assert 400 == status
        assert "already moving" in refused["error"]
    assert demo._mover is not None
    demo._mover.join(60)
    _, state = call(page, f"/ui/state?as={ALICE}")
    assert (None, 1, None) == (
        state["clock"]["forwarding"],
        state["clock"]["forwards_done"],
        state["clock"]["forward_error"],
    )
    assert timedelta(minutes=20) == demo.clock.offset
    assert 2 == len(demo.bot.services.unreserved())  # the sweeps ran on the way


def test_a_second_fast_forward_is_refused_while_one_runs(demo: Demo) -> None:
    with demo._time:
        assert 1 == demo.forward_later(timedelta(minutes=1))
        with pytest.raises(ForwardBusyError):
            demo.forward_later(timedelta(minutes=1))
    assert demo._mover is not None
    demo._mover.join(60)
    assert 2 == demo.forward_later(timedelta(minutes=1))


def test_leaving_closes_the_persons_modals_and_nobody_elses(demo: Demo, page: PageServer) -> None:
    views = demo.local.workspace.views
    for person in (ALICE, BOB):
        opened = demo.bot.app.client.views_open(
            trigger_id=demo.local.workspace.tokens.issue_trigger(person),
            view={"type": "modal", "title": {"type": "plain_text", "text": "Hi"}, "blocks": []},
        )
        assert opened["ok"]
    assert 200 == call(page, "/ui/leave", {"as": ALICE})[0]
    assert ([], 1) == (views.modals(ALICE), len(views.modals(BOB)))
    assert 400 == call(page, "/ui/leave", {"as": "U0NOBODY"})[0]


def test_what_others_wrote_is_unread_until_the_conversation_is_on_screen(demo: Demo) -> None:
    ws = demo.local.workspace
    ws.post("C0GPU", "morning", user=BOB)
    ws.post("C0GPU", "me too", user=ALICE)  # one's own messages are never unread
    gpu = next(c for c in page_state(demo, ALICE)["conversations"] if c["id"] == "C0GPU")
    assert 1 == gpu["unread"]
    gpu = next(c for c in page_state(demo, ALICE, "C0GPU")["conversations"] if c["id"] == "C0GPU")
    assert 0 == gpu["unread"]
    ws.post("C0GPU", "again", user=BOB)
    bob = next(c for c in page_state(demo, BOB)["conversations"] if c["id"] == "C0GPU")
    alice = next(c for c in page_state(demo, ALICE)["conversations"] if c["id"] == "C0GPU")
    assert (1, 1) == (bob["unread"], alice["unread"])  # Bob never opened it: Alice's one


def test_thread_replies_sit_under_their_parent_and_broadcasts_in_the_channel_too(
    demo: Demo,
) -> None:
    """Sent through chat.postMessage with thread_ts and reply_broadcast, as the bot sends them."""
    client = demo.bot.app.client
    assert client.token == BOT_TOKEN
    dm = demo.local.workspace.dm_channel(ALICE)
    parent = client.chat_postMessage(channel=dm, text="Your GPUs are ready")["ts"]
    quiet = client.chat_postMessage(channel=dm, text="ends in 59m", thread_ts=parent)["ts"]
    loud = client.chat_postMessage(
        channel=dm, text="ends in 9m", thread_ts=parent, reply_broadcast=True
    )["ts"]
    conversation = next(c for c in page_state(demo, ALICE)["conversations"] if c["id"] == dm)
    main = {m["ts"]: m for m in conversation["messages"]}
    assert quiet not in main
    assert (2, loud) == (main[parent]["reply_count"], main[parent]["latest_reply"])
    assert (True, parent) == (main[loud]["broadcast"], main[loud]["thread_ts"])
    assert [quiet, loud] == [r["ts"] for r in conversation["threads"][parent]]


def test_every_emoji_the_bot_writes_is_one_the_page_draws() -> None:
    """A `:name:` the page does not know stays as text; each the bot's messages use is known."""
    root = Path(__file__).resolve().parents[3]
    page = (root / "bot/workspace/static/mrkdwn.js").read_text()
    known = set(re.findall(r"\b([a-z0-9_]+): \"", page[page.index("const EMOJI") :]))
    written = {
        name
        for package in ("slack", "services")
        for source in (root / "bot" / package).rglob("*.py")
        for name in re.findall(r"[\"' ]:([a-z][a-z0-9_]*[a-z]):", source.read_text())
    }
    assert written, "the scan found none: its pattern no longer fits the sources"
    assert set() == written - known
