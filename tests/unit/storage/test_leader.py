"""The leader row of the replicas: each takeover bumps the epoch and the fence refuses a deposed
leader's writes; the table lease is taken only when it expired; a job runs once per period
whoever leads; and two replicas claiming outbox and inbox rows never wait on each other."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import Session, select

from storage import inbox, leader, outbox
from storage.db import Database
from storage.outbox import OutboxKind, Owed
from storage.tables import SettingRow
from tests.support.postgres import PostgresServer

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
TTL = timedelta(seconds=15)


class RefusedError(RuntimeError):
    """The fence refused a write (what the bot's jobs raise as DeposedError)."""


def _fence_of(epoch: int) -> Callable[[Session | sa.Connection], None]:
    def check(runner: Session | sa.Connection) -> None:
        if not leader.fence(runner, epoch):
            raise RefusedError(f"epoch {epoch} no longer leads")

    return check


def test_each_takeover_bumps_the_epoch(database: Database) -> None:
    """The first leader is epoch 1 and every later one one more; the row names the holder."""
    with database.write() as session:
        assert leader.take(session, "a:1:aa", at=T0, ttl=TTL) == 1
    with database.write() as session:
        assert leader.take(session, "b:2:bb", at=T0, ttl=TTL) == 2
    with database.read() as session:
        found = leader.held(session)
    assert found is not None
    assert ("b:2:bb", 2) == (found.holder, found.epoch)


def test_a_deposed_leaders_write_is_refused_and_rolled_back(database: Database) -> None:
    """Once another replica took over, a write transaction fenced by the old epoch commits
    nothing; the new leader's commits."""
    with database.write() as session:
        old = leader.take(session, "a:1:aa", at=T0, ttl=TTL)
    with database.write() as session:
        new = leader.take(session, "b:2:bb", at=T0, ttl=TTL)
    with database.fenced(_fence_of(old)), pytest.raises(RefusedError), database.write() as session:
        session.add(_note("by the deposed leader"))
    with database.fenced(_fence_of(new)), database.write() as session:
        session.add(_note("by the leader"))
    with database.read() as session:
        assert ["by the leader"] == [n.key for n in session.exec(select(SettingRow)).all()]


def test_the_table_lease_is_taken_only_once_it_expired(database: Database) -> None:
    """Compare and set on the expiry: a held lease stays; an expired one goes to the next
    replica with a new epoch, and the old holder's renewal then fails."""
    with database.write() as session:
        first = leader.take_expired(session, "a:1:aa", at=T0, ttl=TTL)
    assert first == 1
    with database.write() as session:
        assert leader.take_expired(session, "b:2:bb", at=T0 + TTL / 2, ttl=TTL) is None
        assert leader.renew(session, 1, at=T0 + TTL / 2, ttl=TTL)
    later = T0 + TTL / 2 + TTL + timedelta(seconds=1)
    with database.write() as session:
        assert leader.take_expired(session, "b:2:bb", at=later, ttl=TTL) == 2
        assert not leader.renew(session, 1, at=later, ttl=TTL)
        assert leader.renew(session, 2, at=later, ttl=TTL)


def test_a_clean_stop_ends_the_lease_at_once(database: Database) -> None:
    """give_up: the next replica need not wait for the lease to expire."""
    with database.write() as session:
        leader.take_expired(session, "a:1:aa", at=T0, ttl=TTL)
        leader.give_up(session, 1, at=T0 + timedelta(seconds=1))
    with database.write() as session:
        assert leader.take_expired(session, "b:2:bb", at=T0 + timedelta(seconds=2), ttl=TTL) == 2


def test_a_job_runs_once_per_period_whoever_leads(database: Database) -> None:
    """A new leader does not sweep again within the minute its predecessor swept in."""
    minute = timedelta(minutes=1)
    with database.write() as session:
        assert leader.turn(session, "sweep", at=T0, every=minute, epoch=1)
    with database.write() as session:
        assert not leader.turn(
            session, "sweep", at=T0 + timedelta(seconds=20), every=minute, epoch=2
        )
        assert leader.turn(session, "sweep", at=T0 + minute, every=minute, epoch=2)
    with database.read() as session:
        assert (2, T0 + minute) == leader.runs(session, "sweep")


def test_a_replica_is_alive_while_it_renews(database: Database) -> None:
    """A claim by a replica that renewed lately is its own; one that stopped is anybody's."""
    with database.write() as session:
        leader.here(session, "aa", at=T0, ttl=TTL)
        leader.here(session, "bb", at=T0, ttl=TTL)
        leader.gone(session, "bb")
    with database.read() as session:
        assert leader.alive(session, "aa", at=T0 + TTL / 2)
        assert not leader.alive(session, "aa", at=T0 + TTL)
        assert not leader.alive(session, "bb", at=T0)
    with database.write() as session:
        assert 1 == leader.forget_stopped(session, before=T0 + TTL * 2)


@pytest.mark.postgres
def test_a_takeover_waits_for_the_deposed_leaders_transaction(
    postgres_server: PostgresServer,
) -> None:
    """On PostgreSQL the fence share-locks the row: a takeover waits until the old leader's
    transaction in flight ends, and the old leader's next transaction is refused."""
    db = postgres_server.database_with_schema()
    try:
        with db.write() as session:
            old = leader.take(session, "a:1:aa", at=T0, ttl=TTL)
        inside, took = threading.Event(), threading.Event()
        epochs: list[int] = []

        def takeover() -> None:
            inside.wait(10)
            with db.write() as session:
                epochs.append(leader.take(session, "b:2:bb", at=T0, ttl=TTL))
            took.set()

        thread = threading.Thread(target=takeover)
        thread.start()
        with db.fenced(_fence_of(old)), db.write() as session:
            inside.set()
            # The takeover is blocked on the row while this transaction is open.
            assert not took.wait(0.5)
            session.add(_note("in flight"))
        thread.join(10)
        assert [old + 1] == epochs
        with db.fenced(_fence_of(old)), pytest.raises(RefusedError), db.write() as session:
            session.add(_note("after the takeover"))
        with db.read() as session:
            assert ["in flight"] == [n.key for n in session.exec(select(SettingRow)).all()]
    finally:
        db.dispose()


@pytest.mark.postgres
def test_two_deliverers_pass_over_each_others_rows(postgres_server: PostgresServer) -> None:
    """SKIP LOCKED: the outbox and inbox rows one replica holds are not listed to another, nor
    taken by it, and it does not wait for them (a wait would fail at the short lock_timeout)."""
    db = postgres_server.database_with_schema()
    try:
        with db.write() as session:
            first = outbox.owe(session, Owed(OutboxKind.NOTICE, "n:1", "U1", {}), at=T0)
            second = outbox.owe(session, Owed(OutboxKind.NOTICE, "n:2", "U2", {}), at=T0)
            row_id = inbox.accept(session, key="k1", kind="command", actor="U1", payload={}, at=T0)
        assert row_id is not None
        with db.write() as one:
            held = outbox.due(one, T0)
            assert [first.id, second.id] == [r.id for r in held]
            assert outbox.claim(one, held[0], at=T0, by="one")
            assert inbox.take(one, row_id, at=T0)
            with db.write() as other:
                other.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
                assert [] == outbox.due(other, T0)
                assert [] == inbox.due(other, T0)
                assert not inbox.take(other, row_id, at=T0)
        with db.read() as session:
            assert [second.id] == [r.id for r in outbox.due(session, T0)]
    finally:
        db.dispose()


def _note(text: str) -> SettingRow:
    return SettingRow(key=text, value="1", updated_at=T0, updated_by="test")
