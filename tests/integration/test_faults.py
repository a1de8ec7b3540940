"""Slack and the database failing the ways they do, while people keep typing: no acknowledged
request is lost, no ack is late, and what was sent twice is counted.

Slack: 500s, 429s with Retry-After, answers that take 15 s, and a two-minute outage, at the
local Slack API. The database: an SQLite write lock held for 40 s by another process, a full
disk (a small tmpfs, when the suite runs as root), a PostgreSQL server stopped and restarted.
The bot runs in this process on a clock the test moves, over real HTTP, so the outbox's
backoff plays out in seconds; the scheduler is not started and its jobs are called directly.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import select

from bot.localslack import HttpTransport, LocalSlack, SlackDriver
from bot.localslack.driver import Reply
from bot.main import Bot, assemble
from bot.server import Background, SlackAsgi
from bot.slack.deps import NOT_RECORDED
from storage import outbox
from storage.tables import InboxRow, OutboxRow, RequestRow
from tests.integration.conftest import SECRET, settings_for
from tests.support import postgres
from tests.support.answers import (
    answers_by_token,
    posted_per_outbox_row,
    token_of,
    wait_for_answer,
)

PEOPLE = ("U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001", "U0ERIN001")
SLACK_METHODS = ("response_url", "chat.postMessage", "conversations.open", "views.publish")
ACK_LIMIT_S = 3.0  # Slack's: an ack slower than this shows the person an error


class Clock:
    """The bot's clock: real time plus whatever the test skipped ahead."""

    def __init__(self) -> None:
        self.skipped = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.skipped


@dataclass
class Typed:
    user: str
    text: str
    tag: str
    reply: Reply

    @property
    def recorded(self) -> bool:
        """Acked and recorded (a refusal to record is an ack that says so)."""
        return self.reply.status == 200 and NOT_RECORDED not in (self.reply.text or "")


@dataclass
class Rig:
    bot: Bot
    local: LocalSlack
    slack: SlackDriver
    clock: Clock
    typed: list[Typed] = field(default_factory=list)
    count: int = 0

    def type(self, user: str, text: str) -> Typed:
        """`/gpu text` as `user`; an ack slower than Slack's 3 s shows as status 0."""
        self.count += 1
        tag = f"t{self.count}"
        typed = Typed(
            user, text.format(tag=tag), tag, self.slack.command(user, text.format(tag=tag))
        )
        assert 200 == typed.reply.status, typed.text
        self.typed.append(typed)
        return typed

    def burst(self) -> None:
        """Each person borrows, looks at their leases and their Home tab, then gives back."""
        for user in PEOPLE:
            for text in ("borrow 1 l40s for 1h because {tag}", "mine", "release all"):
                self.type(user, text)
            self.slack.open_home(user)

    def skip(self, by: timedelta, step: timedelta = timedelta(seconds=10)) -> None:
        """Move the clock on, running the inbox and outbox passes as the scheduler would."""
        end = self.clock.skipped + by
        while self.clock.skipped < end:
            self.clock.skipped += step
            self.bot.inbox.run_due()
            self.bot.inbox.wait_idle()
            self.bot.deliverer.idle()
            self.bot.deliverer.deliver_due()

    def owed(self) -> int:
        with self.bot.db.read() as session:
            rows = session.exec(select(OutboxRow)).all()
            waiting = session.exec(select(InboxRow).where(InboxRow.state == "pending")).all()
        return len(waiting) + sum(r.state in (outbox.PENDING, outbox.SENDING) for r in rows)

    def stuck(self) -> list[tuple[object, ...]]:
        with self.bot.db.read() as session:
            rows = session.exec(select(OutboxRow)).all()
            waiting = session.exec(select(InboxRow).where(InboxRow.state == "pending")).all()
        return [("inbox", r.id, r.attempts, r.last_error) for r in waiting] + [
            (r.id, r.kind, r.state, r.claimed_by, r.attempts, r.next_attempt_at, r.last_error[:40])
            for r in rows
            if r.state in (outbox.PENDING, outbox.SENDING)
        ]

    def drain(self, timeout_s: float = 60.0) -> None:
        """Until nothing is owed: time skipped in minutes, the passes run in between (never
        while a send is still under way, which real time must finish)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.bot.inbox.wait_idle()
            self.bot.deliverer.idle()
            if self.owed() == 0:
                return
            assert time.monotonic() < deadline, f"{self.owed()} still owed: {self.stuck()}"
            self.skip(timedelta(minutes=1), step=timedelta(minutes=1))
            time.sleep(0.05)

    def settle(self) -> dict[str, int]:
        """Everything recorded was carried out once and answered; the figures of what repeated."""
        self.drain()
        with self.bot.db.read() as session:
            reasons = Counter(r.reason for r in session.exec(select(RequestRow)).all())
            states = Counter(r.state for r in session.exec(select(OutboxRow)).all())
            inbox_states = Counter(r.state for r in session.exec(select(InboxRow)).all())
        recorded = [t for t in self.typed if t.recorded]
        refused = [t for t in self.typed if not t.recorded]
        borrows = [t for t in recorded if t.text.startswith("borrow")]
        assert [] == [t.tag for t in borrows if reasons[t.tag] != 1]
        assert [] == [t.tag for t in refused if t.text.startswith("borrow") and reasons[t.tag]]
        assert {"done"} >= set(inbox_states), inbox_states
        assert set(states) <= {"delivered", "dropped"}, states
        answers = answers_by_token(self.local)
        assert [] == [t.text for t in recorded if answers[token_of(t.reply)] == 0]
        assert all(NOT_RECORDED in (t.reply.text or "") for t in refused)
        posted = posted_per_outbox_row(self.local)
        assert [] == [row for row, n in posted.items() if n > 1], "a message posted twice"
        assert [] == self.local.violations
        return {
            "recorded": len(recorded),
            "refused": len(refused),
            "replies repeated": sum(n - 1 for n in answers.values() if n > 1),
            "messages repeated": 0,
        }


@pytest.fixture
def rig(local: LocalSlack, tmp_path: Path) -> Iterator[Rig]:
    yield from _rig(local, tmp_path, None)


def _rig(local: LocalSlack, tmp_path: Path, database_url: str | None) -> Iterator[Rig]:
    clock = Clock()
    bot = assemble(settings_for(local, tmp_path, database_url), clock=clock)
    http = Background(SlackAsgi(bot.app, bot.health, ready=bot.ready))
    transport = HttpTransport(http.url + "/slack/events", timeout=ACK_LIMIT_S)
    try:
        yield Rig(bot, local, SlackDriver(local, transport, SECRET), clock)
    finally:
        http.stop()
        bot.close()


@pytest.mark.slow
def test_slack_failing_every_way_loses_no_reply_and_slows_no_ack(rig: Rig) -> None:
    """500s, 429s, 15-second answers and a two-minute outage: every ack in time, every
    request answered, no message twice; replies whose fate Slack never told are counted."""
    for method in SLACK_METHODS:
        rig.local.faults.add(method, status=500, times=2)
        rig.local.faults.add(method, status=429, retry_after=20, times=2)
    rig.burst()
    rig.drain()

    rig.local.faults.add("response_url", delay=15)  # the client gives up after 10 s
    rig.local.faults.add("chat.postMessage", delay=15)
    rig.burst()
    time.sleep(16)  # the slow answers land after all, as a slow Slack's do
    rig.drain()

    for method in SLACK_METHODS:
        rig.local.faults.add(method, status=503, times=1_000_000)
    rig.burst()
    rig.skip(timedelta(minutes=2))
    rig.local.faults.clear()

    figures = rig.settle()
    print(f"\nslack faults: {figures}")
    assert 0 == figures["refused"]
    assert figures["replies repeated"] <= 1  # only the reply whose 15 s answer was given up on


@pytest.mark.slow
def test_a_sqlite_write_lock_held_40_s_loses_nothing_and_sends_nothing_twice(
    rig: Rig, tmp_path: Path
) -> None:
    """Another process holds SQLite's write lock for 40 s: requests the bot cannot record are
    refused with a message (never acked and lost); everything recorded goes out once."""
    rig.local.faults.add("chat.postMessage", delay=1.0)  # deliveries in flight when it locks
    rig.burst()
    other = sqlite3.connect(tmp_path / "gpubot.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    passes = threading.Thread(target=lambda: rig.skip(timedelta(seconds=40), timedelta(seconds=5)))
    try:
        passes.start()
        held_until = time.monotonic() + 40
        while time.monotonic() < held_until:
            for user in PEOPLE[:2]:
                rig.type(user, "borrow 1 l40s for 1h because {tag}")
            time.sleep(3)
    finally:
        other.execute("ROLLBACK")
        other.close()
    passes.join(120)
    figures = rig.settle()
    print(f"\nsqlite lock: {figures}")
    assert figures["refused"] > 0
    assert 0 == figures["replies repeated"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_loses_nothing_and_sends_nothing_twice(
    local: LocalSlack, tmp_path: Path
) -> None:
    """The database's disk fills up: nothing recorded is lost, nothing delivered twice."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(  # noqa: S603 - fixed arguments
        ["/bin/mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        for rig in _rig(local, tmp_path, f"sqlite:///{mount / 'gpubot.db'}"):
            rig.burst()
            rig.local.faults.add("chat.postMessage", status=503, times=1_000_000)
            rig.burst()
            filler = mount / "filler"
            with contextlib.suppress(OSError), filler.open("wb") as fill:  # until it is full
                while True:
                    fill.write(b"\0" * 65536)
                    fill.flush()
            rig.local.faults.clear()
            rig.burst()
            rig.skip(timedelta(minutes=2))
            filler.unlink(missing_ok=True)
            figures = rig.settle()
            print(f"\nfull disk: {figures}")
            assert 0 == figures["replies repeated"]
    finally:
        subprocess.run(["/bin/umount", "-l", str(mount)], check=False)  # noqa: S603


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_stopped_and_restarted_loses_nothing(local: LocalSlack, tmp_path: Path) -> None:
    """PostgreSQL goes away under load and comes back: what was recorded is carried out and
    answered once; what could not be recorded was refused with a message."""
    try:
        server_context = postgres.throwaway_server()
        server = server_context.__enter__()
    except postgres.PostgresUnavailableError as problem:
        pytest.fail(str(problem), pytrace=False)
    try:
        name = server.create_database()
        for rig in _rig(local, tmp_path, server.url_for(name)):
            rig.burst()
            server.stop()
            rig.burst()
            rig.skip(timedelta(minutes=1))
            server.start()
            rig.burst()
            figures = rig.settle()
            print(f"\npostgres restart: {figures}")
            assert figures["refused"] > 0
            assert 0 == figures["replies repeated"]
    finally:
        server_context.__exit__(None, None, None)


def test_the_ack_does_not_wait_for_slack(rig: Rig) -> None:
    """`until fri 18:00` needs the person's zone (users.info), looked up after the ack: a
    users.info that fails never delays it, and the answer owns up to reading UTC."""
    rig.local.faults.add("users.info", status=500, times=20)
    typed = rig.type(PEOPLE[0], "borrow 1 l40s until fri 18:00 because {tag}")
    assert "Times were read in UTC" in str(wait_for_answer(rig.local, typed.reply).args)
    rig.local.faults.clear()
    known = rig.type(PEOPLE[1], "borrow 1 l40s until fri 18:00 because {tag}")
    assert "read in UTC" not in str(wait_for_answer(rig.local, known.reply).args)
