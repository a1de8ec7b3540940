"""Agent pushes from nodes with no orders waiting open no transaction (Ingest's `pending`): the
orders still reach the node whose orders wait, within one read of `pending` at most
`pending_every` old; a failing read falls back to asking; and the read itself
(storage.agent_reads) names exactly the nodes with orders not yet carried away."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from bot.services.enforcement import PENDING
from bot.telemetry.model import to_json
from storage import agent_reads
from storage.db import Database
from storage.tables import EnforcementRow
from tests.unit.storage.builders import a_lease
from tests.unit.telemetry.builders import NODE, IngestRig, a_sample

OTHER = "l40s-node-01"


class Orders:
    """Orders waiting per node; counts who asked."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[dict[str, object]]] = {}
        self.asked: list[str] = []
        self.reads = 0

    def take(self, node: str) -> list[dict[str, object]]:
        self.asked.append(node)
        return self.waiting.pop(node, [])

    def pending(self) -> list[str]:
        self.reads += 1
        return list(self.waiting)


@pytest.fixture
def rig() -> tuple[IngestRig, Orders]:
    bot, orders = IngestRig(), Orders()
    bot.ingest.orders, bot.ingest.pending = orders.take, orders.pending
    return bot, orders


def orders_of(answer: tuple[int, str]) -> list[int]:
    assert 200 == answer[0]
    return [o["id"] for o in json.loads(answer[1])["orders"]]


def test_only_a_node_with_orders_waiting_is_asked_for_them(rig: tuple[IngestRig, Orders]) -> None:
    bot, orders = rig
    orders.waiting[NODE] = [{"id": 7, "lease": 3}]
    theirs = to_json([a_sample(node=OTHER, taken_at=bot.now)])
    assert [] == orders_of(bot.push(theirs, node=OTHER, token="0" * 32, nonce="a"))
    assert [7] == orders_of(bot.push(nonce="b"))
    assert [NODE] == orders.asked


def test_pending_is_read_once_per_interval_and_new_orders_go_out_after_the_next_read(
    rig: tuple[IngestRig, Orders],
) -> None:
    bot, orders = rig
    assert [] == orders_of(bot.push(nonce="a"))
    orders.waiting[NODE] = [{"id": 8, "lease": 4}]  # written just after the read
    bot.now += timedelta(seconds=1)
    assert [] == orders_of(bot.push(nonce="b"))
    assert 1 == orders.reads
    bot.now += timedelta(seconds=1)  # pending_every (2 s) since the read
    assert [8] == orders_of(bot.push(nonce="c"))
    assert 2 == orders.reads


def test_a_failing_read_asks_the_node_itself(rig: tuple[IngestRig, Orders]) -> None:
    bot, orders = rig

    def broken() -> list[str]:
        raise OSError("database gone")

    bot.ingest.pending = broken
    orders.waiting[NODE] = [{"id": 9, "lease": 5}]
    assert [9] == orders_of(bot.push(nonce="a"))


def test_the_read_names_the_nodes_whose_orders_no_agent_carried_away(
    database: Database,
) -> None:
    now = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    assert "pending" == PENDING == agent_reads.WAITING
    with database.write() as session:
        lease = a_lease(session, at=now)
        for node, state in (("n1", "pending"), ("n1", "pending"), ("n2", "sent"), ("n3", "done")):
            session.add(EnforcementRow(created_at=now, lease_id=lease, node=node, state=state))
    assert frozenset({"n1"}) == agent_reads.nodes_with_orders(database)
