"""`/gpu report` through signed requests to the real Bolt app, on SQLite and PostgreSQL: what
each role sees and is refused, figures hand-computed from hourly rows inserted directly, the
text bars, bad input, and the *Chart* / *CSV* buttons owing a REPORT_FILE row."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from sqlmodel import select

from bot.localslack import InProcessTransport, LocalSlack, SlackDriver
from bot.main import Bot, assemble
from bot.services import BorrowAsk, Refused
from bot.services.results import BorrowResult
from storage import keyvalue
from storage.outbox import OutboxKind
from storage.tables import GpuHourRow, OutboxRow
from tests.integration.conftest import SECRET, settings_for

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)  # a Wednesday
DEC1, NOV30 = datetime(2026, 12, 1, 10, tzinfo=UTC), datetime(2026, 11, 30, 20, tzinfo=UTC)
H = timedelta(hours=1)
ALICE, BOB, CAROL, ERIN = "U0ALICE01", "U0BOB0001", "U0CAROL01", "U0ERIN001"
VICTOR, ADA = "U0VMGR001", "U0ADMIN01"


def an_hour(at: datetime, node: str, index: int, **fields: Any) -> GpuHourRow:
    row: dict[str, Any] = {
        "hour": at,
        "pool": "a100",
        "node": node,
        "index": index,
        "team": "",
        "holder": "",
        "lease_id": 0,
        "allocated_s": 3600.0,
        "used_s": 0.0,
        "busy_s": 0.0,
        "idle_s": 0.0,
        "unknown_s": 0.0,
        "unreserved_s": 0.0,
        "memory_peak_mib": None,
    }
    return GpuHourRow(**(row | fields))


def history() -> list[GpuHourRow]:
    """Alice: 2 a100 GPUs x 3 h at 50 %. Bob: 1 l40s GPU x 2 h at 25 %, one hour of it idle
    and 10 minutes without readings. Carol (nlp): 1 a100 x 4 h at 75 %. Half an hour of use
    without a lease. One hour of Alice's long before the window."""
    alice = {"team": "vision", "holder": ALICE, "lease_id": 1, "used_s": 1800.0, "busy_s": 3600.0}
    rows = [an_hour(DEC1 + n * H, "a100-node-01", i, **alice) for n in range(3) for i in (0, 1)]
    bob = {"pool": "l40s", "team": "vision", "holder": BOB, "lease_id": 2, "used_s": 900.0}
    rows.append(an_hour(DEC1, "l40s-node-01", 0, **bob, busy_s=3000.0, unknown_s=600.0))
    rows.append(an_hour(DEC1 + H, "l40s-node-01", 0, **bob, idle_s=3600.0))
    carol = {"team": "nlp", "holder": CAROL, "lease_id": 3, "used_s": 2700.0, "busy_s": 3600.0}
    rows += [an_hour(NOV30 + n * H, "a100-node-02", 0, **carol) for n in range(4)]
    rows.append(an_hour(DEC1, "a100-node-02", 6, allocated_s=0.0, unreserved_s=1800.0))
    old = {"team": "vision", "holder": ALICE, "lease_id": 9, "used_s": 3600.0, "busy_s": 3600.0}
    rows.append(an_hour(datetime(2026, 11, 20, 10, tzinfo=UTC), "a100-node-01", 0, **old))
    return rows


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def bot(request: pytest.FixtureRequest, local: LocalSlack, tmp_path: Path) -> Iterator[Bot]:
    """The bot on the shipped rules at NOW, with the hourly history above."""
    url = request.getfixturevalue("migrated_postgres_url") if request.param == "postgres" else None
    with freeze_time(NOW):
        served = assemble(settings_for(local, tmp_path, url))
        with served.services.db.write() as session:
            session.add_all(history())
        yield served
        served.close()


@pytest.fixture
def slack(bot: Bot, local: LocalSlack) -> SlackDriver:
    return SlackDriver(local, InProcessTransport(bot.app), SECRET)


def report(bot: Bot, local: LocalSlack, slack: SlackDriver, user: str, text: str) -> str:
    """Type `/gpu report …` in #gpu; what the bot answered through response_url."""
    before = len(local.calls.of("response_url"))
    assert 200 == slack.command(user, f"report {text}".strip()).status
    bot.inbox.wait_idle()
    local.wait_for("response_url", lambda a: len(local.calls.of("response_url")) > before)
    return json.dumps(local.calls.of("response_url")[before].args, ensure_ascii=False)


def test_a_member_sees_their_own_use_by_pool(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """Alice's default: 6 GPU-h allocated, 3 used, 50 %, one a100 line; the old hour is out."""
    said = report(bot, local, slack, ALICE, "")
    assert "Your use · " in said
    assert "*Allocated*\\n6.0 GPU-h" in said
    assert "*Used*\\n3.0 GPU-h" in said
    assert "*Efficiency*\\n50 %" in said
    assert "`██████░░░░░░  50 %`  *a100*  3.0 of 6.0 GPU-h" in said
    assert "Unreserved" not in said
    assert "*Cost*\\n14.40 USD" in said  # 6 GPU-h x 2.40 (pools.yaml)


def test_a_member_sees_their_teams_totals_but_not_its_people(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """`team` alone is Alice's team: 8 GPU-h allocated, 3.5 used (44 %), by pool, no names."""
    said = report(bot, local, slack, ALICE, "team")
    assert "Team vision · " in said
    assert "*Allocated*\\n8.0 GPU-h" in said
    assert "*Used*\\n3.5 GPU-h" in said
    assert "*Efficiency*\\n44 %" in said  # 3.5 / 8 = 43.75 %
    assert "`██████░░░░░░  50 %`  *a100*  3.0 of 6.0 GPU-h" in said
    assert "`███░░░░░░░░░  25 %`  *l40s*  0.5 of 2.0 GPU-h" in said
    assert "Bob Brown" not in said
    assert BOB not in said


@pytest.mark.parametrize(
    ("user", "text"),
    [(ALICE, "team nlp"), (ALICE, "lab"), (ALICE, "pool a100"), (VICTOR, "team nlp")],
)
def test_what_a_role_may_not_see_is_refused(
    bot: Bot, local: LocalSlack, slack: SlackDriver, user: str, text: str
) -> None:
    """Another team, or the lab, for a member or another team's manager: a refusal, no figures."""
    said = report(bot, local, slack, user, text)
    assert "Allocated" not in said
    assert "report_chart" not in said
    assert "3.0" not in said  # Carol's figures never leak


def test_a_manager_sees_their_team_person_by_person(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """Victor's default is vision, per person by name, with idle and unknown GPU-h."""
    said = report(bot, local, slack, VICTOR, "")
    assert "Team vision · " in said
    assert "*Idle while allocated*\\n1.0 GPU-h" in said
    assert "*Unknown* (no readings)\\n0.2 GPU-h" in said  # 600 s
    assert "`██████░░░░░░  50 %`  *Alice Anders*  3.0 of 6.0 GPU-h" in said
    assert "`███░░░░░░░░░  25 %`  *Bob Brown*  0.5 of 2.0 GPU-h" in said
    assert "*Cost*\\n16.60 USD" in said  # 6 a100 GPU-h x 2.40 + 2 l40s GPU-h x 1.10


def test_an_admin_sees_the_lab_team_by_team_with_unreserved_use(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """Ada's default: 12 GPU-h allocated, 6.5 used (54 %), half an hour without a lease."""
    said = report(bot, local, slack, ADA, "")
    assert "The whole lab · " in said
    assert "*Allocated*\\n12.0 GPU-h" in said
    assert "*Used*\\n6.5 GPU-h" in said
    assert "*Efficiency*\\n54 %" in said
    assert "*Unreserved* (busy, no lease)\\n0.5 GPU-h" in said
    assert "`█████░░░░░░░  44 %`  *vision*  3.5 of 8.0 GPU-h" in said
    assert "`█████████░░░  75 %`  *nlp*  3.0 of 4.0 GPU-h" in said
    assert "*Reclaims · extensions · recalls*\\n0 · 0 · 0" in said
    assert "no request was granted" in said
    assert "*Cost*\\n26.20 USD" in said  # and Carol's 4 a100 GPU-h x 2.40


def test_a_misspelt_team_is_answered_at_once_with_the_teams_there_are(
    bot: Bot, slack: SlackDriver
) -> None:
    """The ack itself says what was read and how to fix it."""
    reply = slack.command(VICTOR, "report team visoin 7d")
    assert 200 == reply.status
    assert reply.text is not None
    assert "I read `report team visoin 7d`: there is no team `visoin`" in reply.text
    assert "teams: vision, nlp, platform" in reply.text
    assert "/gpu report team vision 7d" in reply.text


def test_no_use_in_the_window_suggests_a_longer_one(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """Erin used nothing: said plainly, with a longer window to try, and no buttons."""
    said = report(bot, local, slack, ERIN, "")
    assert "No GPU use by you in this window" in said
    assert "`/gpu report me 30d`" in said
    assert "report_chart" not in said


def click(  # noqa: PLR0917 - one click by one person, as the other helpers take them
    bot: Bot, local: LocalSlack, slack: SlackDriver, user: str, action_id: str, value: str = ""
) -> str:
    """Click a button of the person's report (their first ephemeral answer); what the bot
    answered."""
    before = len(local.calls.of("response_url"))
    assert 200 == slack.click(user, local.ephemerals(user)[0], action_id, value or None).status
    bot.inbox.wait_idle()
    local.wait_for("response_url", lambda a: len(local.calls.of("response_url")) > before)
    return json.dumps(local.calls.of("response_url")[before].args)


def file_rows(bot: Bot) -> list[OutboxRow]:
    with bot.services.db.read() as session:
        found = session.exec(select(OutboxRow).where(OutboxRow.kind == OutboxKind.REPORT_FILE))
        return list(found)


@pytest.mark.parametrize(
    ("action_id", "fmt", "channel", "where"),
    [
        ("report_chart", "png", "C0GPU", "it will appear in this channel in a moment"),
        ("report_csv", "csv", VICTOR, "in your DM with gpubot in a moment, because it names"),
    ],
)
def test_a_click_on_chart_or_csv_owes_the_file_where_it_may_be_seen(  # noqa: PLR0917 - a parametrized table
    bot: Bot, local: LocalSlack, slack: SlackDriver, action_id: str, fmt: str, channel: str,
    where: str,
) -> None:  # fmt: skip
    """The click is answered at once, saying where the file will appear, and owes one
    REPORT_FILE row saying which report: Victor's team chart (its totals) in #gpu, his team
    CSV (person by person) in his DM."""
    report(bot, local, slack, VICTOR, "30d")
    said = click(bot, local, slack, VICTOR, action_id)
    assert where in said
    [row] = file_rows(bot)
    assert VICTOR == row.recipient
    expected = {
        "viewer": VICTOR,
        "scope": "team",
        "name": "vision",
        "window": "30d",
        "format": fmt,
        "channel": channel,
    }
    # The deliverer may already have added the id of the file on its way ("file_id").
    assert expected == {key: row.data.get(key) for key in expected}


def test_someone_elses_report_button_owes_nothing(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """A value naming another viewer, or a report the clicker may not see, is refused."""
    report(bot, local, slack, ALICE, "")
    forged = json.dumps({"viewer": VICTOR, "scope": "team", "name": "vision", "window": ""})
    assert "made for someone else" in click(bot, local, slack, ALICE, "report_chart", forged)
    nlp = json.dumps({"viewer": ALICE, "scope": "team", "name": "nlp", "window": ""})
    refused = click(bot, local, slack, ALICE, "report_csv", nlp)
    assert "You can see your own use" in refused
    assert [] == file_rows(bot)


def test_waits_and_extensions_come_from_requests_and_the_audit(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """A borrow granted at once waited 0 s; its extension is counted for the holder (both a
    minute before the report: a window ends just before its last moment)."""
    granted = bot.services.borrow(ALICE, BorrowAsk("a100", 1, timedelta(hours=2)))
    assert isinstance(granted, BorrowResult)
    assert granted.lease is not None
    extended = bot.services.extend(ALICE, granted.lease.id, timedelta(hours=1))
    assert not isinstance(extended, Refused), extended
    with freeze_time(NOW + timedelta(minutes=1)):
        said = report(bot, local, slack, ALICE, "")
    assert "*Wait for GPUs*\\nmedian 0s, 90 % within 0s (1 granted)" in said
    assert "*Reclaims · extensions · recalls*\\n0 · 1 · 0" in said


def test_admins_see_what_observe_only_rules_would_have_done(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """`report observe` is the admins' evidence before a rule acts; members are told so."""
    said = report(bot, local, slack, ADA, "observe 30d")
    assert "Observe-only rules from 2026-11-02 10:00 CET to 2026-12-02 10:00 CET" in said
    refused = report(bot, local, slack, ALICE, "observe")
    assert "Only admins see what observe-only rules would have done." in refused
    assert "would have done nothing in this window" in said
    assert "Observe-only rules" not in refused


def test_a_lease_granted_this_hour_is_named_not_reported_as_no_use(
    bot: Bot, local: LocalSlack, slack: SlackDriver
) -> None:
    """Erin's lease, granted at 09:10 UTC and not in any hour summed yet (the rollup has rolled
    to 09:00): at 09:50 her report names it and when it will show, in her zone (UTC+9), never
    "No GPU use"."""
    with freeze_time(NOW + timedelta(minutes=10)):
        granted = bot.services.borrow(ERIN, BorrowAsk("a100", 2, timedelta(hours=2)))
    assert isinstance(granted, BorrowResult)
    assert granted.lease is not None
    with bot.services.db.write() as session:
        keyvalue.set_rolled_until(session, NOW, at=NOW, by="rollup")
    with freeze_time(NOW + timedelta(minutes=50)):
        said = report(bot, local, slack, ERIN, "")
    assert "No GPU use" not in said
    assert (
        f"Your lease L{granted.lease.id} (2 GPUs since 18:10) will appear in reports after "
        "19:00.\\nWhole hours to 18:00 (this hour's use shows after it ends)."
    ) in said
