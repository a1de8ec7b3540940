"""A report's chart or CSV reaches Slack as a shared file, once: uploaded through the local Slack
API's files.getUploadURLExternal, the bytes and files.completeUploadExternal, and shown in the
channel; refused when the person may no longer see it; looked up, not shared again, after a
crash; shared in the asker's DM where the bot cannot share it in its channel."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlmodel import select

from bot.localslack import Channel, LocalSlack, SlackDriver
from bot.localslack.transports import HttpTransport
from bot.main import assemble
from bot.server import Background, SlackAsgi
from bot.services import Refused
from rules.reports import Scope, ScopeKind, Window
from storage.outbox import OutboxKind, Owed, owe
from storage.tables import GpuHourRow, OutboxRow
from tests.integration.conftest import SECRET, Running, settings_for
from tests.unit.bot.test_charts import PNG_SIGNATURE, png_size

ALICE, BOB, VICTOR, ADA = "U0ALICE01", "U0BOB0001", "U0VMGR001", "U0ADMIN01"
GPU = "C0GPU"
VISION = Scope(ScopeKind.TEAM, "vision")
NEW_YORK = ZoneInfo("America/New_York")  # Victor's zone: his report's days are New York days
WEEK = Window(
    datetime(2026, 11, 24, tzinfo=NEW_YORK), datetime(2026, 11, 27, tzinfo=NEW_YORK), "3 days"
)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def bot(request: pytest.FixtureRequest, local: LocalSlack, tmp_path: Path) -> Iterator[Running]:
    """The bot on SQLite, then on PostgreSQL, with the local Slack API and team vision's
    hourly use: on 24 Nov (New York) Alice held 2 a100 GPUs ($2.40 an hour) for 5 hours at
    50 %, on 25 Nov Bob 1 l40s GPU ($1.10) for 4 hours at 100 %."""
    url = request.getfixturevalue("migrated_postgres_url") if request.param == "postgres" else None
    assembled = assemble(settings_for(local, tmp_path, url))
    http = Background(SlackAsgi(assembled.app, assembled.health))
    slack = SlackDriver(local, HttpTransport(http.url + "/slack/events"), SECRET)
    with assembled.db.write() as session:
        session.add_all(
            [
                *(
                    _hour(datetime(2026, 11, 24, 14 + h, tzinfo=UTC), ALICE, "a100", index, 0.5)
                    for h in range(5)
                    for index in (0, 1)
                ),
                *(
                    _hour(datetime(2026, 11, 25, 15 + h, tzinfo=UTC), BOB, "l40s", 0, 1.0)
                    for h in range(4)
                ),
            ]
        )
    yield Running(assembled, local, http.url, slack)
    http.stop()
    assembled.close()


def _hour(at: datetime, holder: str, pool: str, index: int, util: float) -> GpuHourRow:
    return GpuHourRow(
        hour=at, pool=pool, node=f"{pool}-node-01", index=index, team="vision", holder=holder,
        lease_id=1 if holder == ALICE else 2, allocated_s=3600.0, used_s=3600.0 * util,
        busy_s=3600.0 * util, idle_s=3600.0 * (1 - util),
    )  # fmt: skip


def file_rows(running: Running) -> list[OutboxRow]:
    with running.bot.db.read() as session:
        return list(session.exec(select(OutboxRow).where(OutboxRow.kind == "report_file")).all())


def shared(local: LocalSlack, channel: str = GPU) -> list[tuple[str, bytes]]:
    """(title, bytes) of each file shared in the channel, oldest first."""
    out = []
    for message in local.messages(channel):
        for file_id in message.files:
            file = local.workspace.file(file_id)
            assert file is not None
            out.append((file.title, file.content or b""))
    return out


def test_a_chart_is_uploaded_and_shared_in_the_channel_once(bot: Running) -> None:
    """The PNG arrives at the local Slack API in three steps, is shown in #gpu with its
    comment, and a second delivery pass shares nothing more."""
    owed = bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="png", channel=GPU, asked="3d")
    assert owed is None
    bot.deliver()
    bot.deliver()
    calls = [c.method for c in bot.local.calls if c.method.startswith(("files.", "upload"))]
    assert ["files.getUploadURLExternal", "upload", "files.completeUploadExternal"] == calls
    ((title, content),) = shared(bot.local)
    assert PNG_SIGNATURE == content[:8]
    assert (1000, 500) == png_size(content)
    assert "GPU use of team vision, 3 days (24 Nov to 26 Nov 2026)" == title
    message = bot.local.last_message(GPU)
    assert message is not None
    assert "the chart Victor Vision asked for" in message.text
    file = bot.local.workspace.file(message.files[0])
    assert file is not None
    assert "gpubot-report-team-vision-3d.png" == file.name
    (row,) = file_rows(bot)
    assert ("delivered", file.id) == (row.state, row.data["file_id"])
    assert [] == bot.local.violations


def test_the_csv_has_the_figures_per_person_by_name_and_per_day_in_the_readers_zone(
    bot: Running,
) -> None:
    """Hand-checked: Alice 10 GPU-h, 5 used, 5 idle, $24.00; Bob 4, all used, $4.40; 14 in
    all, 9 used (64.3 %), $28.40; days in New York, the last one empty."""
    owed = bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="csv", channel=GPU, asked="3d")
    assert owed is None
    bot.deliver()
    ((title, content),) = shared(bot.local)
    assert "GPU use of team vision, 3 days (24 Nov to 26 Nov 2026) (CSV)" == title
    assert [
        "section,key,name,allocated_gpu_h,used_gpu_h,idle_gpu_h,unknown_gpu_h,"
        "unreserved_gpu_h,efficiency_pct,cost_usd",
        "total,,,14.00,9.00,5.00,0.00,0.00,64.3,28.40",
        "holder,U0ALICE01,Alice Anders,10.00,5.00,5.00,0.00,0.00,50.0,24.00",
        "holder,U0BOB0001,Bob Brown,4.00,4.00,0.00,0.00,0.00,100.0,4.40",
        "day,2026-11-24,2026-11-24 (America/New_York),10.00,5.00,5.00,0.00,0.00,50.0,24.00",
        "day,2026-11-25,2026-11-25 (America/New_York),4.00,4.00,0.00,0.00,0.00,100.0,4.40",
        "day,2026-11-26,2026-11-26 (America/New_York),0.00,0.00,0.00,0.00,0.00,,0.00",
    ] == content.decode().splitlines()
    file = bot.local.workspace.file(bot.local.messages(GPU)[-1].files[0])
    assert file is not None
    assert ("gpubot-report-team-vision-3d.csv", "text/csv") == (file.name, file.mimetype)


def test_the_row_a_chart_button_owes_is_drawn_for_its_window_in_the_readers_zone(
    bot: Running,
) -> None:
    """*CSV* under `/gpu report team vision 2026-11` owes the window as typed: read when the
    file is drawn, as November in Victor's New York, and shared in the channel it names."""
    data = {
        "viewer": VICTOR, "scope": "team", "name": "vision", "window": "2026-11",
        "format": "csv", "channel": GPU,
    }  # fmt: skip
    with bot.bot.db.write() as session:
        owe(
            session,
            Owed(OutboxKind.REPORT_FILE, "inbox:1", VICTOR, data),
            at=bot.bot.services.now(),
        )
    bot.deliver()
    ((title, content),) = shared(bot.local)
    assert "GPU use of team vision, November 2026 (1 Nov to 30 Nov 2026) (CSV)" == title
    rows = content.decode().splitlines()
    assert "total,,,14.00,9.00,5.00,0.00,0.00,64.3,28.40" == rows[1]
    assert 30 == len([r for r in rows if r.startswith("day,")])
    assert (
        "day,2026-11-24,2026-11-24 (America/New_York),10.00,5.00,5.00,0.00,0.00,50.0,24.00" in rows
    )
    file = bot.local.workspace.file(bot.local.messages(GPU)[-1].files[0])
    assert file is not None
    assert "gpubot-report-team-vision-2026-11.csv" == file.name


def test_who_may_no_longer_see_the_report_is_told_in_their_dm_and_nothing_is_shared(
    bot: Running,
) -> None:
    """A file owed for Bob about team nlp (as if he had left it since he clicked): the
    deliverer asks again, shares nothing and tells him why, in words, in his DM."""
    data = {
        "viewer": BOB, "scope": "team", "name": "nlp", "window": "7d", "format": "png",
        "channel": GPU,
    }  # fmt: skip
    with bot.bot.db.write() as session:
        owe(session, Owed(OutboxKind.REPORT_FILE, "inbox:1", BOB, data), at=bot.bot.services.now())
    bot.deliver()
    assert [] == bot.local.calls.of("files.getUploadURLExternal")
    assert [] == bot.local.messages(GPU)
    message = bot.local.last_message(BOB)
    assert message is not None
    assert "Bob Brown, I did not share that report: You can see your own use" in message.text
    assert ["delivered"] == [row.state for row in file_rows(bot)]


def test_asking_for_what_one_may_not_see_is_refused_at_once(bot: Running) -> None:
    """Nothing is owed: the refusal comes back to the caller to answer."""
    refused = bot.bot.services.report_file(BOB, VISION, WEEK, fmt="csv", channel=GPU, by="holder")
    assert isinstance(refused, Refused)
    assert "Only the team's managers and admins see a team's use per person" in refused.message
    assert [] == file_rows(bot)


def test_a_share_in_doubt_after_a_crash_is_found_by_its_file_id_not_shared_again(
    bot: Running,
) -> None:
    """Shared, then the process died before recording it: the next deliverer finds the
    file in the channel by the id kept before the share, and records it delivered."""
    bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="png", channel=GPU)
    bot.deliver()
    (row,) = file_rows(bot)
    with bot.bot.db.write() as session:  # as if killed between Slack's answer and the record
        found = session.get(OutboxRow, row.id)
        assert found is not None
        found.state, found.claimed_by, found.channel = "sending", "gone", None
        found.next_attempt_at = bot.bot.services.now()
        session.add(found)
    bot.deliver()
    assert 1 == len(shared(bot.local))
    assert 1 == len(bot.local.calls.of("files.getUploadURLExternal"))
    ((state, channel),) = [(r.state, r.channel) for r in file_rows(bot)]
    assert ("delivered", GPU) == (state, channel)


def test_an_upload_never_shared_before_a_crash_is_shared_once(bot: Running) -> None:
    """The bytes went up but the share failed and the process died: the kept file id is in
    no message, so the file is uploaded again and shared, once."""
    bot.local.faults.add("files.completeUploadExternal", status=500)
    bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="png", channel=GPU)
    bot.deliver()
    (row,) = file_rows(bot)
    assert "pending" == row.state
    first = row.data["file_id"]
    with bot.bot.db.write() as session:
        found = session.get(OutboxRow, row.id)
        assert found is not None
        found.state, found.claimed_by = "sending", "gone"
        found.next_attempt_at = bot.bot.services.now()
        session.add(found)
    bot.deliver()
    assert 1 == len(shared(bot.local))
    (row,) = file_rows(bot)
    assert "delivered" == row.state
    assert first != row.data["file_id"]


def test_a_channel_the_bot_is_not_in_or_that_is_gone_gets_the_file_in_the_dm(
    bot: Running,
) -> None:
    """The person was told the file would appear: where the bot cannot share it, it is shared
    in their DM with the bot instead, once."""
    with bot.local.workspace.lock:
        bot.local.workspace.channels["C0RANDOM"] = Channel(
            id="C0RANDOM", name="random", members={ALICE}
        )
    bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="png", channel="C0RANDOM")
    bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="csv", channel="C0GONE")
    bot.deliver()
    bot.deliver()
    rows = file_rows(bot)
    assert ["delivered", "delivered"] == [r.state for r in rows]
    dm = bot.local.dm_channel(VICTOR)
    assert {dm} == {r.channel for r in rows}
    titles = [title for title, _ in shared(bot.local, dm)]
    assert 2 == len(titles)
    assert [] == shared(bot.local, "C0RANDOM")


def test_without_matplotlib_the_chart_is_text_bars(
    bot: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `reports` extra is missing: a message says how to get charts, with text bars."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="png", channel=GPU)
    bot.deliver()
    assert [] == bot.local.calls.of("files.getUploadURLExternal")
    message = bot.local.last_message(GPU)
    assert message is not None
    assert "pip install 'gpubot[reports]'); here are text bars" in message.text
    assert "Tue 24 Nov " + "█" * 10 + "░" * 10 + " 10.0 GPU-h allocated, 5.0 used (50 %)" in (
        message.text
    )
    assert "Wed 25 Nov " + "█" * 8 + " " * 12 + " 4.0 GPU-h allocated, 4.0 used (100 %)" in (
        message.text
    )


def test_the_chart_button_under_a_report_shares_the_chart_in_that_channel(bot: Running) -> None:
    """End to end: Victor types `/gpu report team vision 2026-11` in #gpu and clicks *Chart*;
    the PNG lands in #gpu, once."""
    assert 200 == bot.slack.command(VICTOR, "report team vision 2026-11").status
    bot.deliver()
    (answer,) = bot.local.ephemerals(VICTOR)
    assert 200 == bot.slack.click(VICTOR, answer, "report_chart").status
    bot.deliver()
    bot.deliver()
    ((title, content),) = shared(bot.local)
    assert "GPU use of team vision, November 2026 (1 Nov to 30 Nov 2026)" == title
    assert PNG_SIGNATURE == content[:8]
    assert 1 == len(bot.local.calls.of("files.completeUploadExternal"))


def test_without_matplotlib_text_bars_for_a_channel_the_bot_is_not_in_go_to_the_dm(
    bot: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slack answers not_in_channel to the text bars' post: they are posted in Victor's DM
    instead, once, never dropped."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with bot.local.workspace.lock:
        bot.local.workspace.channels["C0RANDOM"] = Channel(
            id="C0RANDOM", name="random", members={ALICE}
        )
    bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="png", channel="C0RANDOM")
    bot.deliver()
    bot.deliver()
    dm = bot.local.dm_channel(VICTOR)
    ((state, channel),) = [(r.state, r.channel) for r in file_rows(bot)]
    assert ("delivered", dm) == (state, channel)
    assert [] == bot.local.messages("C0RANDOM")
    (message,) = bot.local.messages(dm)
    assert "here are text bars" in message.text
    assert "Tue 24 Nov " + "█" * 10 + "░" * 10 + " 10.0 GPU-h allocated" in message.text


def test_a_forged_me_chart_is_titled_for_the_viewer_not_the_name_it_carries(
    bot: Running,
) -> None:
    """A `me` row naming Alice, owed to Victor: the figures are Victor's own, and so is the
    title; Alice's name appears nowhere."""
    data = {
        "viewer": VICTOR, "scope": "me", "name": ALICE, "window": "7d", "format": "png",
        "channel": GPU,
    }  # fmt: skip
    with bot.bot.db.write() as session:
        owe(
            session,
            Owed(OutboxKind.REPORT_FILE, "inbox:1", VICTOR, data),
            at=bot.bot.services.now(),
        )
    bot.deliver()
    ((title, _),) = shared(bot.local)
    assert title.startswith("GPU use of Victor Vision, last 7 days")
    message = bot.local.last_message(GPU)
    assert message is not None
    assert "Alice" not in title + message.text


def test_a_file_that_names_people_or_goes_beyond_the_team_lands_in_the_askers_dm(
    bot: Running,
) -> None:
    """In #gpu: Victor's team CSV (person by person) lands in his DM, his team chart (its
    totals) in #gpu; Ada's lab chart in her DM. Each click says where."""
    said = {}
    for user, text, action_id in [
        (VICTOR, "report team vision 2026-11", "report_csv"),
        (VICTOR, "report team vision 2026-11", "report_chart"),
        (ADA, "report lab 2026-11", "report_chart"),
    ]:
        before = len(bot.local.calls.of("response_url"))
        assert 200 == bot.slack.command(user, text).status
        bot.deliver()
        answer = bot.local.ephemerals(user)[-1]
        assert 200 == bot.slack.click(user, answer, action_id).status
        bot.deliver()
        bot.deliver()
        said[user, action_id] = str(bot.local.calls.of("response_url")[before + 1 :])
    assert (
        "in your DM with gpubot in a moment, because it names people"
        in (said[VICTOR, "report_csv"])
    )
    assert "it will appear in this channel in a moment" in said[VICTOR, "report_chart"]
    assert (
        "in your DM with gpubot in a moment, because not everyone here"
        in (said[ADA, "report_chart"])
    )
    assert ["GPU use of team vision, November 2026 (1 Nov to 30 Nov 2026)"] == [
        title for title, _ in shared(bot.local, GPU)
    ]
    assert ["GPU use of team vision, November 2026 (1 Nov to 30 Nov 2026) (CSV)"] == [
        title for title, _ in shared(bot.local, bot.local.dm_channel(VICTOR))
    ]
    assert ["GPU use of the lab, November 2026 (1 Nov to 30 Nov 2026)"] == [
        title for title, _ in shared(bot.local, bot.local.dm_channel(ADA))
    ]


@pytest.mark.parametrize("charts", [True, False], ids=["chart", "text-bars"])
def test_a_share_in_the_dm_left_in_doubt_is_found_there_not_sent_again(
    bot: Running, monkeypatch: pytest.MonkeyPatch, charts: bool
) -> None:
    """For a channel the bot is not in, the chart (or its text bars) went to Victor's DM and
    the process died before recording it: the next deliverer finds it in the DM."""
    if not charts:
        monkeypatch.setitem(sys.modules, "matplotlib", None)
    with bot.local.workspace.lock:
        bot.local.workspace.channels["C0RANDOM"] = Channel(
            id="C0RANDOM", name="random", members={ALICE}
        )
    bot.bot.services.report_file(VICTOR, VISION, WEEK, fmt="png", channel="C0RANDOM")
    bot.deliver()
    (row,) = file_rows(bot)
    with bot.bot.db.write() as session:  # as if killed between Slack's answer and the record
        found = session.get(OutboxRow, row.id)
        assert found is not None
        found.state, found.claimed_by, found.channel = "sending", "gone", None
        found.next_attempt_at = bot.bot.services.now()
        session.add(found)
    bot.deliver()
    dm = bot.local.dm_channel(VICTOR)
    assert 1 == len(bot.local.messages(dm))
    ((state, channel),) = [(r.state, r.channel) for r in file_rows(bot)]
    assert ("delivered", dm) == (state, channel)


def test_a_click_in_a_channel_the_bot_is_not_in_says_the_file_goes_to_the_dm(
    bot: Running,
) -> None:
    """Victor asks for his team's chart in #random, where gpubot is not: the click's answer
    says it will appear in his DM, because gpubot cannot post there, and it does."""
    with bot.local.workspace.lock:
        bot.local.workspace.channels["C0RANDOM"] = Channel(
            id="C0RANDOM", name="random", members={ALICE, VICTOR}
        )
    before = len(bot.local.calls.of("response_url"))
    assert 200 == bot.slack.command(VICTOR, "report team vision 2026-11", "C0RANDOM").status
    bot.deliver()
    answer = bot.local.ephemerals(VICTOR)[-1]
    assert 200 == bot.slack.click(VICTOR, answer, "report_chart").status
    bot.deliver()
    bot.deliver()
    said = str(bot.local.calls.of("response_url")[before + 1 :])
    assert (
        "Drawing the chart; it will appear in your DM with gpubot in a moment, because I "
        "cannot post here."
    ) in said
    assert [] == shared(bot.local, "C0RANDOM")
    assert ["GPU use of team vision, November 2026 (1 Nov to 30 Nov 2026)"] == [
        title for title, _ in shared(bot.local, bot.local.dm_channel(VICTOR))
    ]
