"""The nodes repository: nodes by name, their GPUs, and lifecycle events oldest first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from storage import nodes
from storage.db import Database
from storage.tables import DeviceEventRow, GpuRow, NodeRow, PoolRow

AT = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)


def a_fleet(database: Database) -> None:
    with database.write() as session:
        session.add(PoolRow(name="a100", model="A100"))
        session.flush()
        for name in ("n2", "n1"):
            node = NodeRow(name=name, pool="a100")
            session.add(node)
            session.flush()
            assert node.id is not None
            for index, state in ((1, "unhealthy"), (0, "ok")):
                session.add(GpuRow(node_id=node.id, index=index, pool="a100", state=state))


def test_nodes_come_by_name_with_their_gpus_by_index(database: Database) -> None:
    """Nodes read by name; a node's GPUs by index; the unhealthy ones apart."""
    a_fleet(database)
    with database.read() as session:
        found = nodes.nodes(session)
        n1 = nodes.named(session, "n1")
        assert n1 is not None
        assert (["n1", "n2"], [0, 1], [1]) == (
            [n.name for n in found],
            [g.index for g in nodes.gpus_by_index(session, n1.id)],
            [g.index for g in nodes.unhealthy_gpus(session, n1.id)],
        )
        assert (None, {"n1": "a100", "n2": "a100"}) == (
            nodes.named(session, "n9"),
            nodes.pools_of_nodes(session),
        )


def test_events_read_oldest_first_and_the_newest_when_limited(database: Database) -> None:
    """`limit` keeps the newest events, still oldest first; `name` and `since` filter."""
    with database.write() as session:
        for minute, node in enumerate(("n1", "n2", "n1", "n1")):
            at = AT + timedelta(minutes=minute)
            session.add(DeviceEventRow(at=at, node=node, gpu=None, kind=f"k{minute}", actor="a"))
    with database.read() as session:
        assert (["k2", "k3"], ["k1"], ["k2", "k3"]) == (
            [e.kind for e in nodes.events(session, "n1", limit=2)],
            [e.kind for e in nodes.events(session, "n2")],
            [e.kind for e in nodes.events(session, "n1", since=AT + timedelta(minutes=1))],
        )
