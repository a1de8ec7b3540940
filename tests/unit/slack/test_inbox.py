"""The inbox's workers: each recorded request is carried out once, one person's in arrival order,
its effects and its answer committed together; a failing database is retried, a bug is told."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlmodel import select

from bot.slack.blocks.kit import Message
from bot.slack.inbox import Accepted, Answer, Inbox, request_key
from storage import inbox as stored
from storage.db import Database
from storage.tables import InboxRow, OutboxRow, PoolRow

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _reply(text: str) -> Message:
    return Message(text, [{"type": "section", "text": {"type": "mrkdwn", "text": text}}])


def _rows(database: Database) -> dict[int, InboxRow]:
    with database.read() as session:
        return {r.id or 0: r for r in session.exec(select(InboxRow)).all()}


def _recording(ran: list[int]) -> Callable[[InboxRow, object], Answer]:
    def record(row: InboxRow, _: object) -> Answer:
        ran.append(row.id or 0)
        return Answer()

    return record


def _outbox(database: Database) -> list[OutboxRow]:
    with database.read() as session:
        return list(session.exec(select(OutboxRow)).all())


def test_a_request_accepted_twice_is_carried_out_once(database: Database) -> None:
    """A replay of the same body (same key) is acknowledged and never run again."""
    ran: list[int] = []
    box = Inbox(database, Clock(), {"command": _recording(ran)})
    body = {"command": "/gpu", "text": "mine", "user_id": "U1", "trigger_id": "t1"}
    assert Accepted.NEW == box.accept(key=request_key(body), kind="command", actor="U1", payload={})
    assert Accepted.REPEATED == box.accept(
        key=request_key(dict(body)), kind="command", actor="U1", payload={}
    )
    assert box.wait_idle()
    box.stop()
    assert 1 == len(ran)


def test_an_event_is_keyed_by_its_event_id() -> None:
    """Slack's retry of an event carries the same event_id; two clicks differ in their body."""
    assert "event:Ev1" == request_key({"event_id": "Ev1", "event": {"type": "app_home_opened"}})
    assert request_key({"trigger_id": "1"}) != request_key({"trigger_id": "2"})


def test_one_persons_requests_run_in_the_order_they_came(database: Database) -> None:
    """Four workers, one person: their requests still run one after another, in order."""
    seen: list[int] = []

    def slowly(row: InboxRow, _: object) -> Answer:
        seen.append(int(row.payload["n"]))
        time.sleep(0.002)
        return Answer()

    box = Inbox(database, Clock(), {"command": slowly}, workers=4)
    for n in range(12):
        box.accept(key=f"k{n}", kind="command", actor="U1", payload={"n": n})
    assert box.wait_idle()
    box.stop()
    assert list(range(12)) == seen


def test_different_people_are_served_side_by_side(database: Database) -> None:
    """One person's slow request does not hold up another's."""
    other_done = threading.Event()

    def handle(row: InboxRow, _: object) -> Answer:
        if row.actor == "U1":
            assert other_done.wait(10), "U2 waited behind U1"
        else:
            other_done.set()
        return Answer()

    if database.dialect == "sqlite":
        # One SQLite writer at a time: the slow request must not hold the database while it
        # waits, so it waits before its unit of work (in `prepare`).
        box = Inbox(
            database,
            Clock(),
            {"command": lambda row, _: Answer()},
            prepare=lambda row: handle(row, None),
            workers=2,
        )
    else:
        box = Inbox(database, Clock(), {"command": handle}, workers=2)
    box.accept(key="slow", kind="command", actor="U1", payload={})
    box.accept(key="quick", kind="command", actor="U2", payload={})
    assert box.wait_idle()
    box.stop()
    assert {"done"} == {r.state for r in _rows(database).values()}


def test_the_effects_and_the_answer_commit_together(database: Database) -> None:
    """The use case's writes, the reply owed to the person and `done` land in one commit."""

    def borrow(row: InboxRow, _: object) -> Answer:
        with database.write() as session:
            session.add(PoolRow(name="a100"))
        return Answer(reply=_reply("Granted L1"), home=True)

    delivered: list[list[int]] = []
    box = Inbox(database, Clock(), {"command": borrow}, delivered=delivered.append)
    box.accept(key="k", kind="command", actor="U1", payload={"response_url": "http://r/1"})
    assert box.wait_idle()
    box.stop()
    (row,) = _rows(database).values()
    assert ("done", 1) == (row.state, row.attempts)
    owed = _outbox(database)
    assert [("reply", "U1"), ("home", "U1")] == [(o.kind, o.recipient) for o in owed]
    assert "http://r/1" == owed[0].data["response_url"]
    assert [[o.id for o in owed]] == delivered
    with database.read() as session:
        assert ["a100"] == [p.name for p in session.exec(select(PoolRow)).all()]


def test_a_bug_undoes_the_effects_and_tells_the_person_a_reference(database: Database) -> None:
    """An exception rolls the whole unit back; the person gets a reference, once."""

    def broken(row: InboxRow, _: object) -> Answer:
        with database.write() as session:
            session.add(PoolRow(name="a100"))
        raise ValueError("a bug")

    box = Inbox(database, Clock(), {"command": broken})
    box.accept(key="k", kind="command", actor="U1", payload={})
    assert box.wait_idle()
    box.stop()
    (row,) = _rows(database).values()
    assert "failed" == row.state
    (owed,) = _outbox(database)
    assert "reply" == owed.kind
    assert "reference" in owed.data["text"]
    assert "Nothing of this request was carried out" in owed.data["text"]
    with database.read() as session:
        assert [] == list(session.exec(select(PoolRow)).all())


def test_a_failing_database_is_retried_after_a_backoff(database: Database) -> None:
    """An OperationalError leaves the row pending with its next attempt pushed back; the
    periodic pass runs it once that time has come."""
    clock, tries = Clock(), []

    def flaky(row: InboxRow, _: object) -> Answer:
        tries.append(clock.now)
        if len(tries) == 1:
            raise sa.exc.OperationalError("INSERT", {}, Exception("database is locked"))
        return Answer(reply=_reply("ok"))

    box = Inbox(database, clock, {"command": flaky})
    box.accept(key="k", kind="command", actor="U1", payload={})
    assert box.wait_idle()
    (row,) = _rows(database).values()
    assert ("pending", 1) == (row.state, row.attempts)
    assert "database is locked" in row.last_error
    assert 0 == box.run_due()  # not yet
    clock.now = T0 + timedelta(seconds=2)
    assert 1 == box.run_due()
    assert box.wait_idle()
    box.stop()
    assert "done" == next(iter(_rows(database).values())).state
    assert 2 == len(tries)


def test_what_an_earlier_process_acknowledged_runs_at_start_up(database: Database) -> None:
    """Rows left pending by a crash are carried out by the next process's first pass."""
    with database.write() as session:
        for n in range(3):
            stored.accept(session, key=f"k{n}", kind="command", actor="U1", payload={}, at=T0)
    ran: list[int] = []
    box = Inbox(database, Clock(), {"command": _recording(ran)})
    assert 3 == box.run_due()
    assert box.wait_idle()
    box.stop()
    assert [1, 2, 3] == ran


def test_a_request_the_database_cannot_record_is_said_to_be_unavailable(tmp_path: Path) -> None:
    """No row, no ack: the listener tells the person nothing was done."""
    database = Database(f"sqlite:///{tmp_path / 'missing' / 'gpubot.db'}")
    try:
        box = Inbox(database, Clock(), {})
        assert Accepted.UNAVAILABLE == box.accept(key="k", kind="command", actor="U1", payload={})
    finally:
        database.dispose()
