"""The weekly digests end to end, on SQLite and PostgreSQL: the sweep job owes them, the outbox
delivers them to the local Slack API, once per period across repeated sweeps and a restart."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from freezegun import freeze_time

from bot.localslack import LocalSlack
from bot.main import Bot, assemble
from bot.settings import DEFAULT_RULES_DIR, Settings
from storage import keyvalue
from storage.tables import GpuHourRow, LeaseRow
from tests.integration.conftest import settings_for

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # Monday 10:00 in Berlin: 09:00 has passed
ALICE = "U0ALICE01"
GPU_CHANNEL = "C0GPU"
SCHEDULES = f"""
  lab_digest: {{channel: {GPU_CHANNEL}, day: mon, at: "09:00", tz: Europe/Berlin}}
  personal_digests: {{day: mon, at: "09:00", tz: Europe/Berlin}}
"""


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def database_url(request: pytest.FixtureRequest) -> str | None:
    """The bot's database: its SQLite file, then a PostgreSQL database."""
    return (
        str(request.getfixturevalue("migrated_postgres_url"))
        if request.param == "postgres"
        else None
    )


def digest_settings(local: LocalSlack, tmp_path: Path, database_url: str | None) -> Settings:
    """The shipped rules with a weekly lab digest in #gpu and personal digests."""
    rules = tmp_path / "rules"
    shutil.copytree(DEFAULT_RULES_DIR, rules)
    with (rules / "reports.yaml").open("a", encoding="utf-8") as reports:
        reports.write(SCHEDULES)
    return settings_for(local, tmp_path, database_url).model_copy(update={"rules_dir": rules})


def alices_week(bot: Bot) -> None:
    """Alice held one a100 for 3 hours on Sunday, at 40 % (hand-written hourly rows, and the
    rollup's marker at the hour they end at)."""
    first = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    with bot.db.write() as session:
        keyvalue.set_rolled_until(session, T0.replace(minute=0), at=T0, by="test")
        session.add(LeaseRow(id=900, holder=ALICE, team="vision", pool="a100", gpus=1,
                             state="released", granted_at=first,
                             expires_at=first + timedelta(hours=3)))  # fmt: skip
        session.add_all(
            GpuHourRow(hour=first + timedelta(hours=h), pool="a100", node="a100-node-01",
                       index=7, team="vision", holder=ALICE, lease_id=900, allocated_s=3600,
                       used_s=1440, busy_s=3600)
            for h in range(3)
        )  # fmt: skip


def sweep_and_deliver(bot: Bot) -> None:
    """The `sweep` job, then the outbox job until nothing it can send is left."""
    bot.sweep()
    bot.inbox.wait_idle()
    bot.deliverer.idle()
    for _ in range(10):
        report = bot.deliverer.deliver_due()
        if not report.delivered and not report.dropped:
            return


def digests_in(local: LocalSlack, channel: str) -> list[str]:
    return [
        m.text + json.dumps(m.blocks, ensure_ascii=False)
        for m in local.messages(channel)
        if "GPU use, week of" in m.text or m.text.startswith("Your GPUs")
    ]


def test_a_digest_is_sent_once_across_sweeps_and_a_restart(
    local: LocalSlack, tmp_path: Path, database_url: str | None
) -> None:
    settings = digest_settings(local, tmp_path, database_url)
    with freeze_time(T0) as clock:
        bot = assemble(settings)
        try:
            alices_week(bot)
            for _ in range(3):
                sweep_and_deliver(bot)
                clock.tick(timedelta(minutes=1))
        finally:
            bot.close()
        bot = assemble(settings)  # a restart: what was owed and sent is in the database
        try:
            sweep_and_deliver(bot)
        finally:
            bot.close()
    lab = digests_in(local, GPU_CHANNEL)
    mine = digests_in(local, local.dm_channel(ALICE))
    assert (1, 1) == (len(lab), len(mine))
    # 3 GPU-h at 40 %: 1.2 used; a100 costs 2.40 an hour: 7.20 USD
    assert lab[0].startswith(
        "GPU use, week of Feb 23: *3.0 GPU-h* held, 40 % efficiency (1.2 GPU-h used); "
        "0.0 GPU-h held idle. Cost: 7.20 USD."
    )
    assert "`█████░░░░░░░  40 %`  *vision*  1.2 of 3.0 GPU-h used" in lab[0]
    assert mine[0].startswith(
        "Your GPUs last week: 3.0 GPU-h held, 40 % efficiency (1.2 GPU-h used), "
        "0.0 GPU-h of it idle; cost 7.20 USD."
    )


def test_the_next_weeks_digest_goes_out_the_next_week(
    local: LocalSlack, tmp_path: Path, database_url: str | None
) -> None:
    """Not before its send time; at it, once the sweep has rolled the week's last hour (the
    rollup job had not looked yet)."""
    settings = digest_settings(local, tmp_path, database_url)
    with freeze_time(T0) as clock:
        bot = assemble(settings)
        try:
            sweep_and_deliver(bot)
            clock.tick(timedelta(days=6, hours=22, minutes=59))  # Monday 08:59 in Berlin
            sweep_and_deliver(bot)
            assert 1 == len(digests_in(local, GPU_CHANNEL))
            clock.tick(timedelta(minutes=1))  # 09:00 there: the rollup reaches it in the pass
            with bot.db.read() as session:
                assert keyvalue.rolled_until(session) != T0 + timedelta(days=6, hours=23)
            sweep_and_deliver(bot)
            with bot.db.read() as session:
                assert T0 + timedelta(days=6, hours=23) == keyvalue.rolled_until(session)
        finally:
            bot.close()
    assert ["week of Feb 23", "week of Mar 2"] == [
        text.split(":", 1)[0].removeprefix("GPU use, ") for text in digests_in(local, GPU_CHANNEL)
    ]
