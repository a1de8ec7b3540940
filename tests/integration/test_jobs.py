"""The jobs `gpubot serve` runs, on the simulated fleet: poll, sweep, retention, and what
people get from them (an unreserved-use DM whose button reserves that very GPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory
from sqlmodel import select

from bot.jobs import ROLLUP
from bot.localslack import InProcessTransport, LocalSlack, SlackDriver
from bot.main import Bot, assemble
from bot.metrics import SETTLE
from storage import keyvalue
from storage.tables import AuditRow, GpuHourRow, GpuMinuteRow, MetricsCheckpointRow
from tests.integration.conftest import SECRET, settings_for

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAVE = "U0DAVE001"


@pytest.fixture
def served(local: LocalSlack, tmp_path: Path) -> Iterator[tuple[Bot, FrozenDateTimeFactory]]:
    with freeze_time(T0) as clock:
        assert isinstance(clock, FrozenDateTimeFactory)
        bot = assemble(settings_for(local, tmp_path))  # the simulated fleet
        yield bot, clock
        bot.close()


def run_minutes(bot: Bot, clock: FrozenDateTimeFactory, minutes: int) -> None:
    """What the scheduler does: poll every 30 s, sweep and deliver every minute."""
    for _ in range(minutes):
        for _ in range(2):
            clock.tick(timedelta(seconds=30))
            bot.poll()
        bot.sweep()
        bot.deliverer.deliver_due()


def test_unreserved_use_reaches_the_user_and_one_click_reserves_that_gpu(
    served: tuple[Bot, FrozenDateTimeFactory], local: LocalSlack
) -> None:
    """dave's process on a100-node-02 GPU 6 without a lease: a DM with a Borrow button that
    leases exactly that GPU; admins hear of it too."""
    bot, clock = served
    run_minutes(bot, clock, 20)
    assert 28 == len(bot.telemetry.readings(bot.services.now()))
    dm = local.dm_channel(DAVE)
    notice = next(m for m in local.messages(dm) if "a100-node-02" in m.text and "GPU 6" in m.text)
    slack = SlackDriver(local, InProcessTransport(bot.app), SECRET)
    slack.click(DAVE, notice, "borrow_quick")
    local.wait_for("response_url", lambda a: "Granted" in json.dumps(a))
    lease = bot.services.leases(DAVE)[0]
    assert ("a100-node-02", 6) == (lease.gpus[0].node, lease.gpus[0].index)
    admin = local.dm_channel("U0ADMIN01")
    assert any("a100-node-02 GPU 6" in json.dumps(m.blocks) for m in local.messages(admin))
    before = len(local.messages(dm))
    run_minutes(bot, clock, 3)
    assert before + 1 >= len(local.messages(dm))  # the grant DM at most; no second notice


def test_poll_keeps_per_minute_history_and_retention_prunes_it(
    served: tuple[Bot, FrozenDateTimeFactory],
) -> None:
    """Each completed minute is rolled up per GPU; retention drops what is too old."""
    bot, clock = served
    run_minutes(bot, clock, 5)
    with bot.db.read() as session:
        rows = session.exec(select(GpuMinuteRow)).all()
    assert len(rows) >= 28 * 3
    clock.tick(timedelta(days=31))
    bot.retain()
    with bot.db.read() as session:
        assert [] == session.exec(select(GpuMinuteRow)).all()


def test_retention_keeps_the_minutes_the_rollup_has_not_rolled_yet(
    served: tuple[Bot, FrozenDateTimeFactory],
) -> None:
    """A month-old minute goes only once the hourly rollup has rolled its hour and will not
    roll it again: after a stop, its next pass rolls the two hours before its marker again."""
    bot, clock = served
    run_minutes(bot, clock, 5)
    with bot.db.write() as session:
        keyvalue.set_rolled_until(session, T0, at=T0, by="test")  # rolled up to 09:00, no further
    clock.tick(timedelta(days=31))
    bot.retain()
    with bot.db.read() as session:
        assert 28 * 4 <= len(session.exec(select(GpuMinuteRow)).all())
    with bot.db.write() as session:  # rolled to 11:00: the next pass rolls 09:00 again
        keyvalue.set_rolled_until(session, T0 + 2 * HOUR, at=T0, by="test")
    bot.retain()
    with bot.db.read() as session:
        assert 28 * 4 <= len(session.exec(select(GpuMinuteRow)).all())
    with bot.db.write() as session:
        keyvalue.set_rolled_until(session, T0 + 3 * HOUR, at=T0, by="test")
    bot.retain()
    with bot.db.read() as session:
        assert [] == session.exec(select(GpuMinuteRow)).all()


def test_the_rollup_job_rolls_the_hour_just_completed(
    served: tuple[Bot, FrozenDateTimeFactory],
) -> None:
    """Every 10 minutes the job looks; once 09:00 is over its minutes are in the hourly table:
    dave's process on a GPU nobody leased is unreserved use."""
    bot, clock = served
    assert bot.jobs.scheduler.get_job(ROLLUP) is not None
    run_minutes(bot, clock, 5)
    bot.rollup()
    with bot.db.read() as session:
        assert [] == session.exec(select(GpuHourRow)).all()
    clock.tick(timedelta(hours=1))
    bot.rollup()
    with bot.db.read() as session:
        rows = session.exec(select(GpuHourRow)).all()
    dave = [r for r in rows if (r.node, r.index) == ("a100-node-02", 6)]
    assert [(T0, 0, 4 * 60.0)] == [(r.hour, r.lease_id, r.unreserved_s) for r in dave]
    with bot.db.read() as session:  # and the /metrics checkpoint moved on with it
        checkpoint = session.get(MetricsCheckpointRow, 1)
    assert checkpoint is not None
    assert bot.services.now() - SETTLE == checkpoint.upto


def test_an_agent_with_a_wrong_token_is_refused_and_audited(
    local: LocalSlack, tmp_path: Path
) -> None:
    """With GPUBOT_AGENT_TOKENS_FILE set, serve takes agents' samples; a bad signature gets
    401 and an `agent:refused` audit row naming the node and why."""
    tokens = tmp_path / "agents.yaml"
    tokens.write_text("a100-node-01: s3cret-token-for-node-01\n")
    settings = settings_for(local, tmp_path).model_copy(update={"agent_tokens_file": tokens})
    bot = assemble(settings)
    try:
        assert bot.ingest is not None
        now = str(int(bot.services.now().timestamp()))
        headers = {
            "X-Gpubot-Node": "a100-node-01",
            "X-Gpubot-Timestamp": now,
            "X-Gpubot-Nonce": "n-1",
            "X-Gpubot-Signature": "v1=" + "0" * 64,
        }
        assert 401 == bot.ingest.handle(headers, b"[]")[0]
        with bot.db.read() as session:
            row = session.exec(select(AuditRow).where(AuditRow.tag == "agent:refused")).one()
        assert ("node:a100-node-01", "bad signature") == (row.subject, row.detail["why"])
    finally:
        bot.close()


def test_admins_see_unreserved_use_in_status(
    served: tuple[Bot, FrozenDateTimeFactory], local: LocalSlack
) -> None:
    """`/gpu status` lists GPUs used without a lease for admins, not for everyone."""
    bot, clock = served
    run_minutes(bot, clock, 20)
    slack = SlackDriver(local, InProcessTransport(bot.app), SECRET)
    slack.command("U0ADMIN01", "status")
    shown = local.wait_for("response_url", lambda a: "In use without a lease" in json.dumps(a))
    assert "a100-node-02:6 by dave" in json.dumps(shown.args)
    before = len(local.calls.of("response_url"))
    slack.command("U0ALICE01", "status")
    local.wait_for("response_url", lambda a: len(local.calls.of("response_url")) > before)
    assert "In use without a lease" not in json.dumps(local.calls.of("response_url")[-1].args)


def test_admins_see_every_node_and_one_nodes_history(
    served: tuple[Bot, FrozenDateTimeFactory], local: LocalSlack
) -> None:
    """`/gpu nodes` and `/gpu nodes NODE` for admins; a drain's reason is in the history; a
    member is told the command is for admins."""
    bot, clock = served
    run_minutes(bot, clock, 2)
    slack = SlackDriver(local, InProcessTransport(bot.app), SECRET)

    def answer(user: str, text: str, expect: str) -> str:
        before = len(local.calls.of("response_url"))
        slack.command(user, text)
        found = local.wait_for(
            "response_url",
            lambda a: len(local.calls.of("response_url")) > before and expect in json.dumps(a),
        )
        return json.dumps(found.args)

    typo = slack.command("U0ADMIN01", "admin drain l40s-node-02 fan swap").body  # in the ack
    assert "optionally followed by `because` and why" in typo
    assert "/gpu admin drain a100-node-02 because fan replacement" in typo
    answer("U0ADMIN01", "admin drain l40s-node-02 because fan swap", "is drained")
    listing = answer("U0ADMIN01", "nodes", "Nodes")
    assert "a100-node-02" in listing
    # carol's and dave's work on a100-node-02 runs without a lease here (nothing was seeded)
    assert "4 free, 4 in use without a lease" in listing
    one = answer("U0ADMIN01", "nodes l40s-node-02", "Node l40s-node-02")
    assert "drained by <@U0ADMIN01> (reason fan swap)" in one
    assert "GPU 1" in one
    refused = answer("U0ALICE01", "nodes", "for gpubot admins")
    assert "l40s-node-02" not in refused
