"""Spent nonces: many recorded in one statement, each spent before (in the table or earlier in
the same statement) left out of the answer; expired ones pruned at most a chunk at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from storage import nonces
from storage.db import Database
from storage.tables import AgentNonceRow

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)


def stored(database: Database) -> list[tuple[str, str]]:
    table = AgentNonceRow.__table__  # type: ignore[attr-defined]
    with database.begin() as connection:
        query = sa.select(table.c.node, table.c.nonce).order_by(table.c.id)
        return [(row.node, row.nonce) for row in connection.execute(query)]


def test_only_the_nonces_not_spent_before_are_recorded_and_named(database: Database) -> None:
    with database.begin() as connection:
        assert {("n1", "a")} == nonces.spend(connection, [("n1", "a", LATER)])
    with database.begin() as connection:
        got = nonces.spend(connection, [("n1", "a", LATER), ("n2", "a", LATER), ("n1", "b", LATER)])
    assert {("n2", "a"), ("n1", "b")} == got
    assert [("n1", "a"), ("n2", "a"), ("n1", "b")] == stored(database)


def test_a_nonce_twice_in_one_statement_is_recorded_once(database: Database) -> None:
    with database.begin() as connection:
        got = nonces.spend(connection, [("n1", "a", LATER), ("n1", "a", LATER)])
    assert {("n1", "a")} == got
    assert [("n1", "a")] == stored(database)


def test_nothing_to_spend_touches_nothing(database: Database) -> None:
    with database.begin() as connection:
        assert set() == nonces.spend(connection, [])


def test_prune_deletes_expired_nonces_a_chunk_at_a_time(database: Database) -> None:
    with database.begin() as connection:
        nonces.spend(connection, [("n1", f"old{k}", T0 - timedelta(seconds=k)) for k in range(5)])
        nonces.spend(connection, [("n1", "fresh", LATER)])
    with database.begin() as connection:
        assert 3 == nonces.prune(connection, T0, limit=3)
    with database.begin() as connection:
        assert 1 == nonces.prune(connection, T0, limit=3)  # old0 expires only at T0 itself
    assert [("n1", "old0"), ("n1", "fresh")] == stored(database)
