"""kill -9 under load: what gpubot acknowledged is carried out exactly once and answered, across
more than ten crashes and restarts of a real `gpubot serve` process with 20 clients sending.

The clients are people typing commands (each borrow carries a unique reason, so its request
row can be counted), each waiting a few seconds for the answer before typing the next, as a
person does; the bot is killed at random moments and started again each time. Then:
every acked borrow made exactly one request, every acked command was answered on its
response_url, no message the outbox posted landed twice, nothing is left owed, the audit chain
verifies and no GPU is in two active leases. Replies to a response_url are delivered at least
once: one that was in flight at a kill may arrive twice, and the test prints how many did.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import col, select

from bot.localslack import HttpTransport, LocalSlack, SlackDriver
from storage import audit
from storage.db import Database
from storage.tables import InboxRow, LeaseGpuRow, LeaseRow, OutboxRow, RequestRow
from tests.support.answers import answers_by_token, posted_per_outbox_row
from tests.support.serve import SECRET, Served

CLIENTS = 20
KILLS = 10
PEOPLE = ("U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001", "U0ERIN001")
ANSWER_WAIT_S = 2.0  # how long a person waits for the answer before typing again
RETRY_S = 0.25  # how long a person waits to type again when the bot did not answer at all
# A send left in doubt waits a minute before it is looked for: the drain must make progress
# within STALL_S, and end within DRAIN_S.
STALL_S = 90.0
DRAIN_S = 360.0


@dataclass
class Sent:
    """One command a client typed, and whether the bot acknowledged it."""

    tag: str
    text: str
    status: int  # 200 acked; 0 no answer in time; -1 no connection (the bot was down)
    response_url: str


@dataclass
class Load:
    sent: list[Sent] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    answered: set[str] = field(default_factory=set)  # response_url tokens answered so far
    heard: threading.Condition = field(default_factory=threading.Condition)

    def listen(self, local: LocalSlack) -> None:
        """Note the answers as they reach the workspace's response_urls."""
        seen = 0
        while not self.stop.is_set():
            calls = local.calls.all()
            new = {c.target for c in calls[seen:] if c.method == "response_url"}
            seen = len(calls)
            if new:
                with self.heard:
                    self.answered |= new
                    self.heard.notify_all()
            time.sleep(0.05)

    def wait_answer(self, url: str) -> None:
        token = url.rsplit("/", 1)[-1]
        with self.heard:
            self.heard.wait_for(
                lambda: token in self.answered or self.stop.is_set(), timeout=ANSWER_WAIT_S
            )


def _client(number: int, slack: SlackDriver, load: Load) -> None:
    user, k = PEOPLE[number % len(PEOPLE)], 0
    while not load.stop.is_set():
        k += 1
        tag = f"c{number}k{k}"
        text = (
            "release all"
            if k % 4 == 0
            else "mine"
            if k % 7 == 0
            else f"borrow 1 l40s for 1h because {tag}"
        )
        try:
            reply = slack.command(user, text)
            status, url = reply.status, reply.response_url or ""
        except (OSError, http.client.HTTPException):
            status, url = -1, ""
        with load.lock:
            load.sent.append(Sent(tag, text, status, url))
        if status == 200 and url:
            load.wait_answer(url)  # read the answer (or give up on it) before typing again
        else:
            # The bot is restarting. A person tries again a little later; 20 clients retrying
            # every 50 ms sent ~25,000 requests into a closed port per run, and building and
            # failing each one took the CPU the restarting bot needed. At 0.25 s the port is
            # still tried ~80 times a second, so commands still land the moment it opens.
            time.sleep(RETRY_S)


def _owed(served: Served) -> int | None:
    """What the bot still owes (inbox and outbox rows pending), None when it does not answer."""
    found = served.probe("/healthz")
    if found is None or found[0] != 200:
        return None
    report = found[1]
    waiting, owed = report.get("inbox_pending", 0), report.get("outbox_pending", 0)
    assert isinstance(waiting, int), report
    assert isinstance(owed, int), report
    return waiting + owed


def _crash_repeatedly(served: Served, local: LocalSlack) -> Load:
    """20 clients typing while the bot is killed KILLS times at random moments; then drained."""
    chance = random.Random(20261201)
    load = Load()
    served.start()
    listener = threading.Thread(target=load.listen, args=(local,), daemon=True)
    listener.start()
    clients = [
        threading.Thread(
            target=_client,
            args=(n, SlackDriver(local, HttpTransport(served.events_url, timeout=5), SECRET), load),
            daemon=True,
        )
        for n in range(CLIENTS)
    ]
    try:
        for thread in clients:
            thread.start()
        for _ in range(KILLS):
            time.sleep(chance.uniform(0.5, 2.5))
            served.kill()
            served.start()
        time.sleep(1.0)
        load.stop.set()
        for thread in clients:
            thread.join(15)
        listener.join(5)
        _drain(served)
    finally:
        load.stop.set()
        served.stop()
    return load


def _drain(served: Served) -> None:
    """Wait until nothing is owed: fail when nothing moved for STALL_S, or after DRAIN_S."""
    started = moved = time.monotonic()
    least: int | None = None
    while True:
        owed, now = _owed(served), time.monotonic()
        if owed == 0:
            return
        if owed is not None and (least is None or owed < least):
            least, moved = owed, now
        if now - moved > STALL_S or now - started > DRAIN_S:
            logged = [line for line in served.log_text().splitlines() if "GET /" not in line]
            raise AssertionError(
                f"never drained ({least} owed, {now - started:.0f} s): "
                f"{served.probe('/healthz')}\n" + "\n".join(logged[-40:])
            )
        time.sleep(0.2)


@pytest.mark.slow
def test_acknowledged_commands_survive_kill_9_exactly_once(
    local: LocalSlack, tmp_path: Path
) -> None:
    """Ten and more kill -9 under 20 clients: nothing acked is lost or done twice."""
    served = Served(local, tmp_path)
    load = _crash_repeatedly(served, local)
    acked = [s for s in load.sent if s.status == 200]
    borrows = [s for s in acked if s.text.startswith("borrow")]
    assert KILLS + 1 == served.starts
    assert len(acked) > 200, f"too little load to mean anything: {len(acked)} acked"

    db = Database(served.database_url)
    try:
        with db.read() as session:
            reasons = Counter(r.reason for r in session.exec(select(RequestRow)).all())
            inbox_states = Counter(r.state for r in session.exec(select(InboxRow)).all())
            outbox_states = Counter(r.state for r in session.exec(select(OutboxRow)).all())
            verified = audit.verify(session)
            shared = session.exec(
                select(LeaseGpuRow.gpu_id, sa.func.count())
                .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
                .where(LeaseRow.state == "active")
                .group_by(col(LeaseGpuRow.gpu_id))
                .having(sa.func.count() > 1)
            ).all()
    finally:
        db.dispose()

    # Carried out exactly once: one request per acked borrow; an unacked one at most once.
    assert [] == [s.tag for s in borrows if reasons[s.tag] != 1]
    assert [] == [tag for tag, n in reasons.items() if n > 1]
    assert {"done"} == set(inbox_states), inbox_states
    assert set(outbox_states) <= {"delivered", "dropped"}, outbox_states
    assert verified.ok, verified.problem
    assert [] == shared

    # Answered: every acked command at least once on its response_url.
    answers = answers_by_token(local)
    unanswered = [s.text for s in acked if answers[s.response_url.rsplit("/", 1)[-1]] == 0]
    assert [] == unanswered
    repeated = sum(n - 1 for n in answers.values() if n > 1)

    # No message the outbox posted landed twice (each carries its outbox id).
    posted = posted_per_outbox_row(local)
    assert [] == [row for row, n in posted.items() if n > 1]
    assert local.violations == []

    print(
        f"\ncrash suite: {served.starts - 1} kills, {len(load.sent)} commands sent, "
        f"{len(acked)} acked ({len(borrows)} borrows), {sum(posted.values())} messages posted, "
        f"0 lost, 0 run twice, {repeated} replies repeated on a response_url"
    )
    assert repeated <= 2 * KILLS
