"""A Slack outage delays messages, never loses them; Socket Mode works like HTTP mode."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from slack_bolt.adapter.socket_mode import SocketModeHandler
from sqlmodel import select

from bot.main import assemble
from bot.slack.localapi import APP_TOKEN, LocalSlack, SlackDriver, SocketTransport
from storage.tables import OutboxRow
from tests.integration.conftest import Running, settings_for
from tests.integration.test_flows import ALICE, BOB, answered, card, dm_text


def test_rate_limits_and_server_errors_are_retried_and_delivered_once(running: Running) -> None:
    """429 with Retry-After and a 500 are retried by the client; the DM lands exactly once."""
    answered(running, ALICE, "borrow 2 a100 for 6h")
    running.local.faults.add("chat.postMessage", status=429, retry_after=0)
    running.local.faults.add("chat.postMessage", status=500)
    running.deliver()
    posts = running.local.calls.of("chat.postMessage")
    assert [True, True, False] == [c.faulted for c in posts]
    assert 1 == len(running.local.messages(running.local.dm_channel(ALICE)))
    assert "CUDA_VISIBLE_DEVICES" in dm_text(running, ALICE)


def test_an_outage_keeps_the_message_owed_until_slack_is_back(running: Running) -> None:
    """Longer than the client's retries: the row stays pending with a backoff, then lands."""
    answered(running, ALICE, "borrow 8 a100")
    answered(running, BOB, "borrow 2 a100 because sweep")
    running.local.faults.add("chat.postMessage", status=500, times=20)
    report = running.bot.deliverer.deliver_due()
    assert 1 <= report.failed
    with running.bot.db.read() as session:
        waiting = session.exec(select(OutboxRow).where(OutboxRow.state == "pending")).all()
    assert {"lease_granted", "approval_card"} == {r.kind for r in waiting}
    assert all("internal_error" in r.last_error for r in waiting if r.attempts)
    running.local.faults.clear()  # Slack is back
    later = running.bot.services.ctx.now() + timedelta(minutes=6)
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
