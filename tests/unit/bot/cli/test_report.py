"""`gpubot report`: GPU-hours, efficiency and cost from the hourly rows, with waits and counts
from the real use cases; as a table, CSV and JSON lines; friendly errors; a closed pipe."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time

from bot.services import BorrowAsk, Services
from bot.services.results import ExtendResult
from rules.domain import Outcome
from storage.db import Database
from storage.tables import GpuHourRow, RequestRow
from tests.builders import default_sources
from tests.unit.bot.cli.builders import ROOT, gpubot
from tests.unit.bot.conftest import ALICE, CAROL, ERIN, Clock, approved, borrowed

T = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # the leases' day, a Monday
NOW = "2026-03-05 12:00:00"  # when the command runs
PRIYA = "U0PMGR001"  # platform manager
H = 3600.0
MAIN = "from bot.cli.app import main; main()"


@pytest.fixture
def url(url_either: str) -> str:
    """The command on a migrated SQLite file, then on a migrated PostgreSQL database."""
    return url_either


@pytest.fixture(autouse=True)
def _utc_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")


def hour(
    at: int,
    gpu: int,
    lease: int,
    *,
    used: float = 0,
    busy: float = 0,
    idle: float = 0,
    unknown: float = 0,
) -> GpuHourRow:
    """One a100 GPU-hour of Alice's lease, all of it allocated."""
    return GpuHourRow(
        hour=T.replace(hour=at), pool="a100", node="a100-node-01", index=gpu, team="vision",
        holder=ALICE, lease_id=lease, allocated_s=H, used_s=used, busy_s=busy, idle_s=idle,
        unknown_s=unknown,
    )  # fmt: skip


@pytest.fixture
def filled(url: str) -> str:
    """Through the use cases at 09:00: Alice borrows 2 a100 (granted at once) and extends it;
    Carol 1 l40s (at once); Erin 3 a100 beyond platform's nominal, approved at 09:10.
    Hourly rows by hand: Alice's 2 GPUs for 3 h at 50 %, but GPU 1's last hour 40 minutes idle
    and 20 minutes unknown; Carol's GPU 2 h at 100 %, 14:00 and 15:00; 30 minutes of
    unreserved use at 10:00."""
    database = Database(url)
    clock = Clock(T)
    services = Services.open(database, default_sources(), clock=clock)
    try:
        alice = borrowed(services, ALICE, BorrowAsk("a100", 2, timedelta(hours=3), reason="runs"))
        carol = borrowed(services, CAROL, BorrowAsk("l40s", 1, timedelta(hours=8), reason="eval"))
        erin = borrowed(services, ERIN, BorrowAsk("a100", 3, timedelta(hours=1), reason="x"))
        assert (Outcome.APPROVE, Outcome.APPROVE, Outcome.ASK) == (
            alice.outcome, carol.outcome, erin.outcome,
        )  # fmt: skip
        clock.advance(timedelta(minutes=10))
        approved(services, PRIYA, erin)
        assert alice.lease is not None
        assert carol.lease is not None
        assert isinstance(services.extend(ALICE, alice.lease.id, timedelta(hours=1)), ExtendResult)
        a, c = alice.lease.id, carol.lease.id
        rows = [hour(h, g, a, used=H / 2, busy=H) for h in (9, 10, 11) for g in (0, 1)]
        rows[-1] = hour(11, 1, a, idle=2400, unknown=1200)
        rows += [
            GpuHourRow(hour=T.replace(hour=h), pool="l40s", node="l40s-node-01", index=0,
                       team="nlp", holder=CAROL, lease_id=c, allocated_s=H, used_s=H, busy_s=H)
            for h in (14, 15)
        ]  # fmt: skip
        rows.append(
            GpuHourRow(hour=T.replace(hour=10), pool="a100", node="a100-node-02", index=6,
                       unreserved_s=1800, busy_s=1800)
        )  # fmt: skip
        with database.write() as session:
            session.add_all(rows)
    finally:
        services.close()
        database.dispose()
    return url


def report(url: str, *args: str) -> tuple[int, str, str]:
    with freeze_time(NOW):
        result = gpubot("report", *args, "--database-url", url)
    return result.exit_code, result.stdout, result.stderr


def cells(output: str, first: str) -> list[str]:
    row = next(line for line in output.splitlines() if line.split("│")[0].strip() == first)
    return [cell.strip() for cell in row.split("│")]


def test_the_table_by_user_shows_hand_computed_figures_a_total_and_the_footer(
    filled: str,
) -> None:
    """Alice: 6 GPU-h allocated, 1.5 + 1.5 + 1.5 + 1.5 + 1.5 = 2.5 used (42 %), 40 minutes
    idle, 20 unknown, 6 x 2.40 = 14.40; Carol 2 h at 100 %, 2 x 1.10 = 2.20; unreserved
    0.5 h costs nothing. Waits 0, 0 and 600 s: p50 0s, p90 480 s = 8m."""
    code, out, err = report(filled, "--group-by", "user")
    assert (0, "") == (code, err)
    lines = out.splitlines()
    assert "GPU use, last 7 days: 2026-02-26 12:00 to 2026-03-05 12:00 (UTC)" == lines[0]
    header = [cell.strip() for cell in lines[1].split("┃")]
    assert [
        "user", "allocated GPU-h", "used GPU-h", "efficiency", "idle GPU-h", "unknown GPU-h",
        "unreserved GPU-h", "cost (USD)",
    ] == header  # fmt: skip
    assert ["6.0", "2.5", "42 %", "0.7", "0.3", "0.0", "14.40"] == cells(
        out, f"Alice Anders ({ALICE})"
    )[1:]
    assert ["2.0", "2.0", "100 %", "0.0", "0.0", "0.0", "2.20"] == cells(
        out, f"Carol Chen ({CAROL})"
    )[1:]
    assert ["0.0", "0.0", "-", "0.0", "0.0", "0.5", "0.00"] == cells(out, "no lease (unreserved)")[
        1:
    ]
    assert ["8.0", "4.5", "56 %", "0.7", "0.3", "0.5", "16.60"] == cells(out, "total")[1:]
    assert [
        "Waits from request to grant: p50 0s, p90 8m (over 3 granted)",
        "Reclaims 0, extensions 1, recalls 0",
    ] == lines[-2:]


def test_requests_still_waiting_show_under_the_waits(filled: str) -> None:
    """Two of Alice's requests filed at 10:30 and 11:15 still wait at 12:00 (one for a
    manager, one in the queue): the oldest for 1h 30m, not in the waits."""
    database = Database(filled)
    try:
        with database.write() as session:
            for filed, state in (("10:30", "pending"), ("11:15", "queued")):
                session.add(RequestRow(
                    kind="borrow", requester=ALICE, team="vision", pool="a100", gpus=1,
                    duration_s=3600, state=state, outcome="ask",
                    created_at=datetime.fromisoformat(f"2026-03-05T{filed}:00+00:00"),
                ))  # fmt: skip
    finally:
        database.dispose()
    code, out, _ = report(filled, "--group-by", "user")
    assert 0 == code
    assert [
        "Waits from request to grant: p50 0s, p90 8m (over 3 granted)",
        "Still waiting: 2 requests filed in this window, the oldest for 1h 30m (not in the "
        "waits above until granted)",
        "Reclaims 0, extensions 1, recalls 0",
    ] == out.splitlines()[-3:]


def test_filters_narrow_to_a_team_and_a_pool(filled: str) -> None:
    """--team nlp: Carol's 2 h only; --pool a100 --team vision: Alice's 6 h, waits of
    vision's one request."""
    code, out, _ = report(filled, "--team", "nlp")
    assert ["2.0", "2.0", "100 %", "0.0", "0.0", "0.0", "2.20"] == cells(out, "nlp")[1:]
    assert ["2.0"] == cells(out, "total")[1:2]
    code, out, _ = report(filled, "--team", "vision", "--pool", "a100", "--user", "Alice Anders")
    assert 0 == code
    assert ["6.0", "2.5", "42 %"] == cells(out, "vision")[1:4]
    assert "Waits from request to grant: p50 0s, p90 0s (over 1 granted)" in out


def test_by_day_in_a_zone_puts_each_hour_on_its_local_day(filled: str) -> None:
    """Tokyo is UTC+9: Carol's 15:00 UTC hour is 00:00 on 3 March there, her 14:00 hour
    23:00 on the 2nd (with Alice's 6 h, 2.5 used: 7 h, 3.5 used); every day of the window
    has a line, empty ones too."""
    code, out, _ = report(filled, "--group-by", "day", "--tz", "Asia/Tokyo", "--format", "csv")
    assert 0 == code
    rows = list(csv.DictReader(io.StringIO(out)))
    by_day = {row["key"]: row for row in rows}
    expected_days = [f"2026-02-{d}" for d in (26, 27, 28)] + [f"2026-03-0{d}" for d in range(1, 6)]
    assert expected_days == [row["key"] for row in rows]
    assert ("7.0", "3.5", "0.5") == (
        by_day["2026-03-02"]["allocated_gpu_h"],
        by_day["2026-03-02"]["used_gpu_h"],
        by_day["2026-03-02"]["unreserved_gpu_h"],
    )
    assert ("1.0", "100.0", "1.1") == (
        by_day["2026-03-03"]["allocated_gpu_h"],
        by_day["2026-03-03"]["efficiency_pct"],
        by_day["2026-03-03"]["cost"],
    )
    assert ("0.0", "") == (
        by_day["2026-03-01"]["allocated_gpu_h"],
        by_day["2026-03-01"]["efficiency_pct"],
    )


def test_csv_has_a_header_and_plain_numbers_with_slack_ids(filled: str) -> None:
    code, out, _ = report(filled, "--group-by", "user", "--format", "csv", "--since", "2026-03")
    assert 0 == code
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [ALICE, CAROL, "(unreserved)"] == [row["key"] for row in rows]
    assert {
        "key": ALICE, "allocated_gpu_h": "6.0", "used_gpu_h": "2.5", "efficiency_pct": "41.7",
        "idle_gpu_h": "0.667", "unknown_gpu_h": "0.333", "unreserved_gpu_h": "0.0",
        "cost": "14.4",
    } == rows[0]  # fmt: skip


def test_jsonl_is_one_object_per_line_and_nothing_else(filled: str) -> None:
    code, out, _ = report(filled, "--group-by", "lease", "--format", "jsonl")
    assert 0 == code
    objects = [json.loads(line) for line in out.splitlines()]
    assert ["L1", "L2", "(unreserved)"] == [o["key"] for o in objects]
    assert objects[2]["efficiency_pct"] is None  # nothing allocated: no efficiency
    assert (6.0, 2.5, 41.7, 14.4) == (
        objects[0]["allocated_gpu_h"], objects[0]["used_gpu_h"], objects[0]["efficiency_pct"],
        objects[0]["cost"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "3x"], "error: --since: I could not read `3x` as a time window; use 7d, "
         "30d, 24h or a month like 2026-11.\n"),
        (["--since", "2027-01"], "error: --since: January 2027 has not begun yet.\n"),
        (["--since", "0000-01"], "error: --since: `0000-01` is before what reports cover; "
         "write a month from 2000-01 to 2026-03.\n"),
        (["--since", "0001-01", "--tz", "Asia/Tokyo"], "error: --since: `0001-01` is before "
         "what reports cover; write a month from 2000-01 to 2026-03.\n"),
        (["--since", "9999-12"], "error: --since: December 9999 has not begun yet.\n"),
        (["--team", "robots"], "error: --team: there is no team 'robots'; teams: nlp, "
         "platform, vision\n"),
        (["--pool", "tpu"], "error: --pool: there is no pool 'tpu'; pools: a100, inference, "
         "l40s\n"),
        (["--user", "Nobody Here"], "error: --user: no one is called 'Nobody Here' in "
         "org.yaml's names; give a name or Slack id\n"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_exits_2_with_one_line(url: str, args: list[str], message: str) -> None:
    code, out, err = report(url, *args)
    assert (2, "", message) == (code, out, err)


def test_an_empty_window_says_so(url: str) -> None:
    code, out, _ = report(url)
    assert 0 == code
    assert "No GPU time was recorded in this window." == out.splitlines()[1]


def test_report_and_report_observe_have_help() -> None:
    for command in (["report"], ["report", "observe"]):
        short, long = gpubot(*command, "-h"), gpubot(*command, "--help")
        assert (0, short.stdout) == (long.exit_code, long.stdout)
        assert short.stdout.startswith(f"Usage: gpubot {' '.join(command)}")


def test_report_into_a_pipe_closed_before_it_writes_exits_0_without_a_word(url: str) -> None:
    """As the console script runs it, this tree's code first on the path."""
    read, write = os.pipe()
    os.close(read)
    env = {
        **os.environ,
        "GPUBOT_DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),
    }
    try:
        done = subprocess.run(  # noqa: S603  (our own command line, fixed arguments)
            [sys.executable, "-c", MAIN, "report"], stdout=write, stderr=subprocess.PIPE,
            env=env, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (0, b"") == (done.returncode, done.stderr)
