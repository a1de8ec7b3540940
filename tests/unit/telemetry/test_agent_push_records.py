"""What the bot keeps of its node agents, on SQLite and on PostgreSQL: spent nonces survive a
restart (a replay is refused after it), pushes arriving together record their nonces in one
transaction, expired ones are pruned, and refusals reach the audit
log as at most one aggregated row per known node per window, never for unknown nodes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import col, select

from bot.services import Services, agents
from bot.telemetry.agent_push import Ingest
from bot.telemetry.model import to_json
from bot.telemetry.window import TelemetryWindow
from storage import audit
from storage.db import Database
from storage.tables import AgentNonceRow, AuditRow
from tests.builders import default_sources
from tests.unit.telemetry.builders import NODE, START, TOKEN, IngestRig, a_sample

TOKENS = {NODE: TOKEN, "l40s-node-01": "0" * 32}


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def services_on(database: Database, clock: Clock) -> Services:
    return Services.open(database, default_sources(), engine="reference", clock=clock)


@pytest.fixture
def services(database: Database, clock: Clock) -> Iterator[Services]:
    svc = services_on(database, clock)
    yield svc
    svc.close()


def an_ingest(services: Services) -> Ingest:
    """The bot's Ingest as `assemble` builds it."""
    return Ingest(
        TOKENS,
        TelemetryWindow(stale_after=timedelta(minutes=3), clock=services.now),
        services.now,
        on_refused=services.record_refused_agent,
        spend=services.spend_nonce,
    )


def signed(
    clock: Clock, nonce: str, *, node: str = NODE, token: str = TOKEN
) -> tuple[dict[str, str], bytes]:
    """A push of one sample taken now, signed as `node` with `token`."""
    body = to_json([a_sample(taken_at=clock.now)])
    return IngestRig().headers(body, node=node, token=token, sent=clock.now, nonce=nonce), body


def test_a_replay_is_refused_after_a_restart(
    database: Database, services: Services, clock: Clock
) -> None:
    """The nonce is in the database: a new bot process over it refuses the captured push."""
    headers, body = signed(clock, "captured")
    assert 200 == an_ingest(services).handle(headers, body)[0]
    restarted = services_on(database, clock)
    try:
        clock.now += timedelta(minutes=4)  # still inside the timestamp window
        status, message = an_ingest(restarted).handle(headers, body)
        assert (401, "replayed request (nonce already used)") == (status, message)
    finally:
        restarted.close()


def test_the_same_nonce_from_another_node_is_not_a_replay(services: Services, clock: Clock) -> None:
    assert services.spend_nonce(NODE, "n-1", clock.now)
    assert services.spend_nonce("l40s-node-01", "n-1", clock.now)
    assert not services.spend_nonce(NODE, "n-1", clock.now)


def test_expired_nonces_are_pruned_at_most_once_a_minute(services: Services, clock: Clock) -> None:
    def stored() -> list[str]:
        with services.db.read() as session:
            rows = session.exec(select(AgentNonceRow).order_by(col(AgentNonceRow.id)))
            return [row.nonce for row in rows]

    services.spend_nonce(NODE, "a", clock.now + timedelta(seconds=10))
    services.spend_nonce(NODE, "b", clock.now + timedelta(minutes=5))
    clock.now += timedelta(seconds=30)
    services.spend_nonce(NODE, "c", clock.now + timedelta(minutes=5))
    assert ["a", "b", "c"] == stored()  # "a" expired, but the last prune is 30 s old
    clock.now += timedelta(seconds=31)
    services.spend_nonce(NODE, "d", clock.now + timedelta(minutes=5))
    assert ["b", "c", "d"] == stored()


def refused_rows(services: Services) -> list[AuditRow]:
    with services.db.read() as session:
        query = select(AuditRow).where(AuditRow.tag == "agent:refused")
        return list(session.exec(query.order_by(col(AuditRow.id))))


def test_a_burst_of_refusals_writes_one_audit_row_per_known_node_and_none_for_unknown(
    services: Services, clock: Clock
) -> None:
    """500 forged pushes as a known node and 500 under unknown names: one row, for the known
    node; ten minutes on, the next refusal's row carries everything refused since."""
    ingest = an_ingest(services)
    for k in range(500):
        headers, body = signed(clock, f"a{k}", token="f" * 32)
        assert 401 == ingest.handle(headers, body)[0]
        headers, body = signed(clock, f"b{k}", node=f"gpu-{k}")
        assert 401 == ingest.handle(headers, body)[0]
    rows = refused_rows(services)
    assert [("gpubot", f"node:{NODE}", 1)] == [
        (r.actor, r.subject, r.detail["count"]) for r in rows
    ]
    assert {"bad signature": 1} == rows[0].detail["reasons"]

    clock.now += timedelta(minutes=10)
    body = to_json([a_sample(taken_at=clock.now, node="l40s-node-01")])
    headers = IngestRig().headers(body, nonce="late", sent=clock.now)
    assert 403 == ingest.handle(headers, body)[0]
    rows = refused_rows(services)
    assert 2 == len(rows)
    assert 500 == rows[1].detail["count"]  # 499 unwritten before, and this one
    assert {"bad signature": 499, "samples for another node: l40s-node-01": 1} == rows[1].detail[
        "reasons"
    ]
    assert verify_chain(services)


def verify_chain(services: Services) -> bool:
    with services.db.read() as session:
        return audit.verify(session).ok


def test_the_reasons_kept_per_row_are_bounded(services: Services, clock: Clock) -> None:
    """A signed agent can vary its refusal reasons at will; the row keeps the first eight and
    counts all."""
    for k in range(50):
        services.record_refused_agent(NODE, f"reason {k}")
    clock.now += timedelta(minutes=10)
    services.record_refused_agent(NODE, "last")
    rows = refused_rows(services)
    assert (2, 50, 8) == (len(rows), rows[1].detail["count"], len(rows[1].detail["reasons"]))


def test_nonces_arriving_together_share_a_transaction_and_replays_still_fail(
    shared_db: Database, clock: Clock
) -> None:
    """While the nonce table is locked, 40 pushes queue up (20 nonces, each sent twice): once
    it is free, they are recorded in two transactions, the first push's and everyone else's,
    and of each pair exactly one is spent, the other a replay."""
    services = services_on(shared_db, clock)
    commits: list[int] = []
    sa.event.listen(shared_db.engine, "commit", lambda _connection: commits.append(1))
    answers: dict[int, bool] = {}
    lock = threading.Lock()

    def push(k: int) -> None:
        spent = services.spend_nonce(NODE, f"n{k // 2}", clock.now + timedelta(minutes=5))
        with lock:
            answers[k] = spent

    try:
        with shared_db.begin() as connection:
            if shared_db.dialect == "postgresql":
                connection.execute(sa.text("LOCK TABLE agent_nonce IN EXCLUSIVE MODE"))
            threads = [threading.Thread(target=push, args=(k,)) for k in range(40)]
            book = agents._book(services.ctx)

            def until(done: Callable[[], bool]) -> None:
                deadline = time.monotonic() + 30
                while not done():
                    assert time.monotonic() < deadline, "the pushes never queued up"
                    time.sleep(0.01)

            threads[0].start()  # the first push takes its batch and waits in its transaction
            until(lambda: book.writing and not book.waiting)
            for thread in threads[1:]:
                thread.start()
            until(lambda: len(book.waiting) == 39)
            commits.clear()
        for thread in threads:
            thread.join()
    finally:
        services.close()
    assert 3 == len(commits)  # the lock's, the first push's, and everyone else's
    assert [1] * 20 == [answers[2 * n] + answers[2 * n + 1] for n in range(20)]
    with shared_db.read() as session:
        assert 20 == len(session.exec(select(AgentNonceRow)).all())


def test_a_batch_that_cannot_be_recorded_fails_every_push_in_it(
    database: Database, services: Services, clock: Clock
) -> None:
    """The nonce table is gone: the push raises (the Ingest answers 503), and the next push,
    once it is back, is recorded: nothing is left waiting on a failed batch."""
    with database.begin() as connection:
        connection.execute(sa.text("ALTER TABLE agent_nonce RENAME TO agent_nonce_away"))
    with pytest.raises(RuntimeError, match="could not be recorded"):
        services.spend_nonce(NODE, "a", clock.now + timedelta(minutes=5))
    with database.begin() as connection:
        connection.execute(sa.text("ALTER TABLE agent_nonce_away RENAME TO agent_nonce"))
    assert services.spend_nonce(NODE, "a", clock.now + timedelta(minutes=5))
