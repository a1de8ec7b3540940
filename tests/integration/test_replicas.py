"""Replicas on one PostgreSQL: two real `gpubot serve` processes, exactly one of them the leader.

People keep typing to both while the leader's lock connection is terminated by the server,
then while the new leader is killed with kill -9: the other replica takes over each time, within a
generous bound, nothing acknowledged is lost or done twice, no message lands twice, the sweep
never runs twice in one minute and no lease is reclaimed twice. The election itself (advisory
lock and table lease) is also driven step by step; and SQLite refuses a second serve.
"""

from __future__ import annotations

import http.client
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from slack_sdk import WebClient
from sqlmodel import col, select

from bot.leader import Leader
from bot.localslack import HttpTransport, LocalSlack, SlackDriver
from bot.slack.delivery import Deliverer
from bot.slack.recording import Report
from bot.slack.sending import Sent as SentOutcome
from storage import audit, leader, migrate, outbox
from storage.db import Database
from storage.outbox import OutboxKind, Owed
from storage.tables import (
    AuditRow,
    InboxRow,
    LeaseGpuRow,
    LeaseRow,
    OutboxRow,
    RequestRow,
    SettingRow,
)
from tests.support.answers import answers_by_token, posted_per_outbox_row
from tests.support.serve import SECRET, Served

pytestmark = pytest.mark.postgres

PEOPLE = ("U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001")
TAKEOVER_S = 30.0  # a liveness bound, not a speed figure: the check runs every 2 s
DRAIN_S = 60.0


@dataclass
class Sent:
    tag: str
    text: str
    status: int  # 200 acked; -1 no connection (that replica was down)
    response_url: str


@dataclass
class Load:
    sent: list[Sent] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)


def _client(number: int, drivers: list[SlackDriver], load: Load) -> None:
    """One person typing, to each replica in turn, a command every ~0.3 s."""
    user, k = PEOPLE[number % len(PEOPLE)], 0
    while not load.stop.is_set():
        k += 1
        tag = f"c{number}k{k}"
        text = "release all" if k % 3 == 0 else f"borrow 1 l40s for 1h because {tag}"
        try:
            reply = drivers[k % len(drivers)].command(user, text)
            status, url = reply.status, reply.response_url or ""
        except (OSError, http.client.HTTPException):
            status, url = -1, ""
        with load.lock:
            load.sent.append(Sent(tag, text, status, url))
        load.stop.wait(0.3)


def _health(served: Served) -> dict[str, object] | None:
    found = served.probe("/healthz")
    return found[1] if found is not None and found[0] == 200 else None


def _leaders(replicas: list[Served]) -> list[tuple[Served, int]]:
    """The replicas that say they lead, with their epochs."""
    found = []
    for served in replicas:
        report = _health(served) if served.process and served.process.poll() is None else None
        if report is not None and report.get("leader"):
            found.append((served, int(str(report["leader_epoch"]))))
    return found


def _await_leader(replicas: list[Served], *, after: int = 0) -> tuple[Served, int]:
    """The one replica that leads under an epoch above `after`, once there is exactly one."""
    deadline = time.monotonic() + TAKEOVER_S
    while time.monotonic() < deadline:
        leading = _leaders(replicas)
        if len(leading) == 1 and leading[0][1] > after:
            return leading[0]
        time.sleep(0.2)
    raise AssertionError(f"no single new leader within {TAKEOVER_S} s: {_leaders(replicas)}")


@dataclass
class SweepWatch:
    """Every run of the sweep, as its marker row shows them: (run number, when it began)."""

    url: str
    seen: dict[int, datetime] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def watch(self) -> None:
        db = Database(self.url)
        try:
            while not self.stop.wait(0.1):
                with db.read() as session:
                    runs, began = leader.runs(session, "sweep")
                if began is not None:
                    self.seen.setdefault(runs, began)
        finally:
            db.dispose()


def _terminate_lock_connection(url: str) -> int:
    """pg_terminate_backend on the connection holding the leader's advisory lock: its pid."""
    db = Database(url)
    try:
        with db.write() as session:
            pid = session.execute(
                sa.text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND classid = 0 AND objid = :key AND objsubid = 1 "
                    "AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())"
                ),
                {"key": leader.ADVISORY_KEY},
            ).scalar_one()
            session.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        return int(pid)
    finally:
        db.dispose()


def _drain(url: str, served: Served) -> None:
    """Wait until nothing acknowledged waits and no message is due (a cosmetic redraw owed for
    later may wait on: it was never sent, so it cannot have been sent twice)."""
    deadline = time.monotonic() + DRAIN_S
    db = Database(url)
    owed: tuple[int, int] = (-1, -1)
    try:
        while time.monotonic() < deadline:
            with db.read() as session:
                owed = (
                    session.execute(
                        sa.text("SELECT count(*) FROM inbox WHERE state = 'pending'")
                    ).scalar_one(),
                    session.execute(
                        sa.text(
                            "SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending') "
                            "AND (attempts > 0 OR next_attempt_at <= now())"
                        )
                    ).scalar_one(),
                )
            if owed == (0, 0):
                return
            time.sleep(0.2)
    finally:
        db.dispose()
    raise AssertionError(f"never drained (inbox, outbox owed): {owed}\n{served.log_tail(40)}")


@dataclass
class Recorded:
    """What the database holds at the end."""

    reasons: Counter[str]  # requests per reason (each borrow's reason is unique)
    inbox_states: Counter[str]
    outbox_states: Counter[str]
    reclaims: Counter[str]  # lease:reclaimed audit rows per lease
    chain_ok: bool
    shared: list[object]  # GPUs in two active leases
    runs: int  # sweeps run


def _recorded(url: str) -> Recorded:
    db = Database(url)
    try:
        with db.read() as session:
            reclaimed = select(AuditRow).where(AuditRow.tag == audit.AuditTag.LEASE_RECLAIMED)
            return Recorded(
                reasons=Counter(r.reason for r in session.exec(select(RequestRow)).all()),
                inbox_states=Counter(r.state for r in session.exec(select(InboxRow)).all()),
                outbox_states=Counter(r.state for r in session.exec(select(OutboxRow)).all()),
                reclaims=Counter(r.subject for r in session.exec(reclaimed).all()),
                chain_ok=audit.verify(session).ok,
                shared=list(
                    session.exec(
                        select(LeaseGpuRow.gpu_id, sa.func.count())
                        .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
                        .where(LeaseRow.state == "active")
                        .group_by(col(LeaseGpuRow.gpu_id))
                        .having(sa.func.count() > 1)
                    ).all()
                ),
                runs=leader.runs(session, "sweep")[0],
            )
    finally:
        db.dispose()


@pytest.fixture
def replicas(local: LocalSlack, tmp_path: Path, postgres_url: str) -> Iterator[list[Served]]:
    """Two `gpubot serve --http` on one PostgreSQL, started together; stopped afterwards."""
    both = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        both.append(Served(local, tmp_path / name, database_url=postgres_url))
    try:
        for served in both:
            served.launch(["serve", "--http", "--port", str(served.port)])
        for served in both:
            served.wait("/livez", 90)
        yield both
    finally:
        for served in both:
            served.stop()


@pytest.mark.slow
def test_the_other_replica_takes_over_and_nothing_is_done_twice(
    local: LocalSlack, replicas: list[Served], postgres_url: str
) -> None:
    """Cut the leader's lock connection, then kill -9 the new leader, while people type to
    both: each time the other leads (a new epoch), and every acked command ran exactly once."""
    first, epoch = _await_leader(replicas)
    assert 1 == len(_leaders(replicas))
    drivers = [SlackDriver(local, HttpTransport(s.events_url, timeout=5), SECRET) for s in replicas]
    load, sweeps = Load(), SweepWatch(postgres_url)
    threads = [threading.Thread(target=_client, args=(n, drivers, load)) for n in range(4)]
    threads.append(threading.Thread(target=sweeps.watch))
    for thread in threads:
        thread.start()
    try:
        time.sleep(2.0)
        _terminate_lock_connection(postgres_url)
        second, epoch2 = _await_leader(replicas, after=epoch)
        assert second is not first  # the deposed one rests before it tries again
        time.sleep(1.0)
        second.kill()  # kill -9: its session, and so its advisory lock, ends with it
        third, epoch3 = _await_leader(replicas, after=epoch2)
        assert third is first
        time.sleep(1.0)
        load.stop.set()
        for thread in threads[:-1]:
            thread.join(15)
        _drain(postgres_url, third)
    finally:
        load.stop.set()
        sweeps.stop.set()
        for thread in threads:
            thread.join(15)

    acked = [s for s in load.sent if s.status == 200]
    borrows = [s for s in acked if s.text.startswith("borrow")]
    assert len(acked) > 30, f"too little load to mean anything: {len(load.sent)} sent"
    assert any(s.status == -1 for s in load.sent)  # some were typed to the killed replica
    found = _recorded(postgres_url)
    reasons, reclaims, runs = found.reasons, found.reclaims, found.runs

    # Exactly once: one request per acked borrow, none twice, every acked command answered.
    assert [] == [s.tag for s in borrows if reasons[s.tag] != 1]
    assert [] == [tag for tag, n in reasons.items() if n > 1]
    assert {"done"} == set(found.inbox_states), found.inbox_states
    assert found.outbox_states[outbox.FAILED] == 0, found.outbox_states
    answers = answers_by_token(local)
    assert [] == [s.text for s in acked if answers[s.response_url.rsplit("/", 1)[-1]] == 0]
    # No message the outbox posted landed twice (each carries its outbox id).
    assert [] == [row for row, n in posted_per_outbox_row(local).items() if n > 1]
    assert [] == [lease for lease, n in reclaims.items() if n > 1]
    assert found.chain_ok
    assert [] == found.shared
    # The sweep ran (the first leader's), and never twice within a minute across leaders.
    assert runs >= 1
    began = [sweeps.seen[n] for n in sorted(sweeps.seen)]
    assert [] == [(a, b) for a, b in itertools.pairwise(began) if b - a < timedelta(minutes=1)]
    print(f"\nreplicas: epochs {epoch} -> {epoch2} -> {epoch3}, {len(acked)} acked, {runs} sweeps")


def test_sqlite_refuses_a_second_serve(local: LocalSlack, tmp_path: Path) -> None:
    """A second `gpubot serve` on the same SQLite file stops at once, naming the file, the
    pid holding it and what to use instead; the first one goes on serving."""
    first = Served(local, tmp_path)
    second = Served(local, tmp_path)  # the same workdir: the same serve.db
    first.start()
    try:
        process = second.launch(["serve", "--http", "--port", str(second.port)])
        assert process.wait(60) != 0
        said = second.log_text()
        assert f"(pid {first.process.pid if first.process else '?'})" in said
        assert "serve.db.serve.lock" in said
        assert "PostgreSQL" in said
        assert "Traceback" not in said
        assert first.wait("/readyz")["ok"]
    finally:
        first.stop()


def _election_db(postgres_url: str) -> Database:
    migrate.upgrade(postgres_url)
    return Database(postgres_url)


def test_the_advisory_lock_moves_when_its_connection_is_cut(postgres_url: str) -> None:
    """Step by step: one leads; its lock connection terminated, it steps down at its next
    check and rests; the other takes the lock under the next epoch; a late renewal fails."""
    db = _election_db(postgres_url)
    a = Leader(db, "advisory", token="aaaa")
    b = Leader(db, "advisory", token="bbbb")
    try:
        a.step()
        b.step()
        assert (True, False) == (a.is_leader, b.is_leader)
        first = a.epoch
        _terminate_lock_connection(postgres_url)
        a.step()
        assert not a.is_leader
        b.step()
        a.step()  # resting: it does not try again at once
        assert (False, True) == (a.is_leader, b.is_leader)
        assert b.epoch == (first or 0) + 1
    finally:
        a.stop()
        b.stop()
        db.dispose()


def test_the_table_lease_moves_when_it_expires(postgres_url: str) -> None:
    """GPUBOT_LEADER_LOCK=table: the lease is renewed while held; a holder that stops renewing
    loses it once it expired, and its next renewal finds the epoch moved and stops the jobs."""
    db = _election_db(postgres_url)
    now = [datetime(2026, 12, 2, 9, 0, tzinfo=UTC)]
    a = Leader(db, "table", token="aaaa", clock=lambda: now[0], stand_down=timedelta(0))
    b = Leader(db, "table", token="bbbb", clock=lambda: now[0], stand_down=timedelta(0))
    ran: list[str] = []

    def probe() -> None:
        with db.write() as session:
            session.add(SettingRow(key="probe", value="1", updated_at=now[0], updated_by="a"))
        ran.append("a")

    job = a.job("probe", probe)
    try:
        a.step()
        b.step()
        assert (True, False) == (a.is_leader, b.is_leader)
        now[0] += timedelta(seconds=10)
        a.step()  # renewed
        now[0] += timedelta(seconds=10)
        b.step()
        assert not b.is_leader  # renewed 10 s ago: not expired
        now[0] += timedelta(seconds=20)  # a stalls past its lease
        b.step()
        assert b.is_leader
        job()  # a still believes it leads: its fence refuses the job's first write
        assert ([], False) == (ran, a.is_leader)
        a.step()
        assert (False, True) == (a.is_leader, b.is_leader)
        with db.read() as session:
            assert session.get(SettingRow, "probe") is None
    finally:
        a.stop()
        b.stop()
        db.dispose()


def test_a_replica_records_the_outcomes_its_database_refused(postgres_url: str) -> None:
    """A follower sent a message but could not record it: its own `record_kept` job records
    it later (the delivery pass, which would otherwise, runs on the leader only)."""
    db = _election_db(postgres_url)
    down = Database("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
    deliverer = Deliverer(db, WebClient(base_url="http://127.0.0.1:1/"), lambda row: None, _now)
    try:
        with db.write() as session:
            owed = outbox.owe(session, Owed(OutboxKind.NOTICE, "n:1", "U1", {}), at=_now())
            assert outbox.claim(session, owed, at=_now(), by=deliverer.token)
        refused = deliverer.recorder.record_all(
            down, [(owed, SentOutcome("D1", "1.000001"))], Report(), at=_now()
        )
        assert [True] == refused  # sent, and kept until the database takes it
        assert 1 == deliverer.record_kept().delivered
        with db.read() as session:
            row = outbox.get(session, owed.id or 0)
        assert row is not None
        assert (outbox.DELIVERED, "1.000001") == (row.state, row.ts)
        assert [] == deliverer.recorder.kept_ids()
    finally:
        down.dispose()
        db.dispose()


def _now() -> datetime:
    return datetime.now(UTC)


def test_a_leader_fenced_off_leads_again_on_a_new_connection(postgres_url: str) -> None:
    """The fence, not its own check, told a leader that it was deposed (its lock connection had
    been cut): once the lock is free again it takes it on a fresh connection."""
    db = _election_db(postgres_url)
    a = Leader(db, "advisory", token="aaaa", stand_down=timedelta(0))
    b = Leader(db, "advisory", token="bbbb")
    job = a.job("probe", lambda: _write_probe(db))
    try:
        a.step()
        _terminate_lock_connection(postgres_url)
        b.step()
        assert (True, True) == (a.is_leader, b.is_leader)  # a has not looked yet
        job()  # its first write is fenced off: a steps down
        assert not a.is_leader
        b.stop()  # the lock is free again
        a.step()  # the cut connection fails and is dropped
        a.step()
        assert a.is_leader
        assert 3 == a.epoch
    finally:
        a.stop()
        b.stop()
        db.dispose()


def _write_probe(db: Database) -> None:
    with db.write() as session:
        session.add(SettingRow(key="probe", value="1", updated_at=_now(), updated_by="test"))
