"""A Slack outage delays messages, never loses them; Socket Mode works like HTTP mode."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest
from slack_bolt.adapter.socket_mode import SocketModeHandler
from sqlmodel import select

from bot.localslack import APP_TOKEN, LocalSlack, SlackDriver, SocketTransport
from bot.main import assemble
from storage import db as db_module
from storage.db import Database
from storage.tables import OutboxRow
from tests.integration.conftest import Running, settings_for
from tests.integration.test_flows import ALICE, BOB, answered, card, dm_text
from tests.support.answers import posted_per_outbox_row


def test_rate_limits_and_server_errors_are_retried_and_delivered_once(running: Running) -> None:
    """A 429 waits in the outbox for its Retry-After, a 500 for its backoff (the pass never
    sleeps on either, and the client never re-sends on its own); the DM lands exactly once."""
    running.local.faults.add("chat.postMessage", status=429, retry_after=30)
    running.local.faults.add("chat.postMessage", status=500)
    now = running.bot.services.now()
    answered(running, ALICE, "borrow 2 a100 for 6h")  # the grant DM's first try: the 429
    deliverer = running.bot.deliverer
    assert deliverer.idle()
    with running.bot.db.read() as session:
        grant = session.exec(select(OutboxRow).where(OutboxRow.kind == "lease_granted")).one()
    assert ("pending", 1) == (grant.state, grant.attempts)
    assert grant.next_attempt_at >= now + timedelta(seconds=30)
    for seconds in (29, 31, 40):
        deliverer.clock = lambda at=now + timedelta(seconds=seconds): at  # type: ignore[misc]
        running.deliver()
    posts = running.local.calls.of("chat.postMessage")
    assert [True, True, False] == [c.faulted for c in posts]
    assert 1 == len(running.local.messages(running.local.dm_channel(ALICE)))
    assert "CUDA_VISIBLE_DEVICES" in dm_text(running, ALICE)


def test_an_outage_keeps_the_message_owed_until_slack_is_back(running: Running) -> None:
    """Longer than any retry: the rows stay pending with a backoff, then land."""
    running.local.faults.add("chat.postMessage", status=500, times=20)
    answered(running, ALICE, "borrow 8 a100")
    answered(running, BOB, "borrow 2 a100 because sweep")
    assert running.bot.deliverer.idle()
    running.bot.deliverer.deliver_due()
    assert [] == [c for c in running.local.calls.of("chat.postMessage") if not c.faulted]
    with running.bot.db.read() as session:
        rows = session.exec(select(OutboxRow).where(OutboxRow.state == "pending")).all()
        waiting = [r for r in rows if r.kind != "home"]  # Home tabs: views.publish is up
    assert {"lease_granted", "approval_card"} == {r.kind for r in waiting}
    assert all("internal_error" in r.last_error for r in waiting)
    running.local.faults.clear()  # Slack is back
    later = running.bot.services.now() + timedelta(minutes=6)
    running.bot.deliverer.clock = lambda: later
    running.deliver()
    assert "request_approve" in json.dumps(card(running).blocks)
    assert "CUDA_VISIBLE_DEVICES" in dm_text(running, ALICE)
    with running.bot.db.read() as session:
        assert [] == session.exec(select(OutboxRow).where(OutboxRow.state == "pending")).all()


@pytest.mark.usefixtures("no_proxies")
def test_socket_mode_runs_the_same_app_without_a_public_url(
    local: LocalSlack, tmp_path: Path
) -> None:
    """The bot connects out over a WebSocket; commands arrive as envelopes and are acked."""
    bot = assemble(settings_for(local, tmp_path))
    handler = SocketModeHandler(bot.app, APP_TOKEN)
    handler.connect()  # type: ignore[no-untyped-call]  # slack_bolt leaves it unannotated
    try:
        local.wait_for_socket(timeout=10)
        slack = SlackDriver(local, SocketTransport(local))
        reply = slack.command(ALICE, "borrow 2 l40s for 2h")
        assert 200 == reply.status
        call = local.wait_for("response_url", lambda a: "Granted" in json.dumps(a))
        assert "ephemeral" == call.args["response_type"]
        problem = slack.command(ALICE, "borrow two l40s fr 2h")
        assert problem.text is not None
        assert "Try:" in problem.text
    finally:
        handler.close()  # type: ignore[no-untyped-call]
        bot.close()


def _grant(running: Running) -> OutboxRow:
    with running.bot.db.read() as session:
        return session.exec(select(OutboxRow).where(OutboxRow.kind == "lease_granted")).one()


def _posted(running: Running, row_id: int | None) -> int:
    """How many messages in the workspace carry this outbox row's id."""
    return posted_per_outbox_row(running.local)[row_id or 0]


def test_a_delivery_the_database_cannot_record_is_recorded_later_never_sent_again(
    running: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slack took the DM, then the database refused the bookkeeping: the outcome is kept and
    recorded once the database answers again; the DM is never posted a second time."""
    monkeypatch.setattr(db_module, "_SQLITE_BUSY_TIMEOUT_MS", 200)
    deliverer = running.bot.deliverer
    deliverer.db = Database(str(running.bot.db.url))  # same file, short busy timeout
    running.local.faults.add("chat.postMessage", delay=1.0)  # in flight when the lock comes
    assert 200 == running.slack.command(ALICE, "borrow 2 a100 for 6h").status
    time.sleep(0.4)
    other = sqlite3.connect(tmp_path / "gpubot.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        assert deliverer.idle()  # sent, and its bookkeeping refused
        later = running.bot.services.now() + timedelta(minutes=1)
        deliverer.clock = lambda: later
        for _ in range(3):  # passes while the database stays locked: nothing is sent again
            assert 0 == deliverer.deliver_due().delivered
    finally:
        other.execute("ROLLBACK")
        other.close()
    running.deliver()
    grant = _grant(running)
    assert ("delivered", 1) == (grant.state, _posted(running, grant.id))
    assert 1 == len(running.local.calls.of("chat.postMessage"))
    assert 1 == len(running.local.calls.of("response_url"))
    deliverer.db.dispose()


def test_a_message_in_doubt_after_a_crash_is_looked_up_before_it_is_sent(
    running: Running,
) -> None:
    """A row another process claimed and never settled: found in the conversation by its
    outbox id, it is recorded as delivered; one that never landed is sent, once."""
    answered(running, ALICE, "borrow 2 a100 for 6h")
    running.deliver()
    grant = _grant(running)
    assert 1 == _posted(running, grant.id)
    with running.bot.db.write() as session:  # as if killed between Slack's answer and the record
        row = session.get(OutboxRow, grant.id)
        assert row is not None
        row.state, row.claimed_by, row.channel, row.ts = "sending", "gone", None, None
        row.next_attempt_at = running.bot.services.now()
        session.add(row)
    running.deliver()
    assert ("delivered", 1) == (_grant(running).state, _posted(running, grant.id))

    answered(running, BOB, "borrow 1 a100 for 1h")
    with running.bot.db.write() as session:  # claimed by a process that died before sending
        row = session.exec(
            select(OutboxRow).where(OutboxRow.kind == "lease_granted", OutboxRow.id != grant.id)
        ).one()
        row.state, row.claimed_by = "sending", "gone"
        row.claimed_at = row.next_attempt_at = running.bot.services.now()
        session.add(row)
        unsent = row.id
    running.deliver()
    assert 1 == _posted(running, unsent)
