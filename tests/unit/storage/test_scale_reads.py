"""The reads every command makes, shaped for a large fleet and a long history: held lease GPUs
found through the partial index, counts and recalls asked of SQL, one read for many leases."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from rules.marks import Marks
from storage import gpus, leases, requests
from storage.db import Database
from storage.gpus import Place, PlaceCount
from storage.outbox import OutboxKind, Owed, owe
from storage.tables import GpuRow, NodeRow, PoolRow, RequestRow
from tests.unit.storage.builders import a_lease

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=1)


def a_fleet(session: Session) -> list[int]:
    """Pool a100: node-01 with four healthy GPUs, node-02 (drained) with two, and one
    unhealthy GPU on node-03; the ids, node by node."""
    session.add(PoolRow(name="a100"))
    session.flush()
    ids = []
    for name, count, drained in (
        ("node-01", 4, False),
        ("node-02", 2, True),
        ("node-03", 1, False),
    ):
        node = NodeRow(name=name, pool="a100", drained=drained)
        session.add(node)
        session.flush()
        assert node.id is not None
        state = "unhealthy" if name == "node-03" else "ok"
        for i in range(count):
            gpu = GpuRow(node_id=node.id, index=i, pool="a100", model="A100", state=state)
            session.add(gpu)
            session.flush()
            assert gpu.id is not None
            ids.append(gpu.id)
    return ids


def recalled(request: int) -> Marks:
    return Marks().with_recall(at=START, request=request, team="nlp", because="it was lent")


def test_pool_leases_count_usable_gpus_and_read_only_a_recall_s_marks(database: Database) -> None:
    """Each active lease with its GPUs that would come back free (not drained, not unhealthy),
    and its marks only when it is being recalled."""
    with database.write() as session:
        ids = a_fleet(session)
        plain = a_lease(session, at=START, gpu_ids=ids[:2], marks=Marks({"notice:x": {}}))
        mixed = a_lease(session, at=START, gpu_ids=[ids[2], ids[4], ids[6]], marks=recalled(7))
        a_lease(session, at=START, gpu_ids=ids[3:4], state="released", marks=recalled(7))
    with database.read() as session:
        found = {lease.id: lease for lease in leases.pool_leases(session, "a100")}
        assert leases.any_recalled(session, "a100")
        assert not leases.any_recalled(session, "l40s")
    assert [plain, mixed] == sorted(found)
    assert (2, Marks()) == (found[plain].usable, found[plain].marks)
    assert (1, 3) == (found[mixed].usable, found[mixed].gpus)
    assert (7, START) == (found[mixed].marks.recalled_for, found[mixed].marks.recalled_at)


def test_no_recall_in_the_pool_is_told_by_sql(database: Database) -> None:
    """Marks other than a recall, and a recall on an ended lease, are no recall in the pool."""
    with database.write() as session:
        ids = a_fleet(session)
        a_lease(session, at=START, gpu_ids=ids[:1], marks=Marks({"expiry_60": {"outbox": 3}}))
        a_lease(session, at=START, gpu_ids=ids[1:2], state="reclaimed", marks=recalled(4))
    with database.read() as session:
        assert not leases.any_recalled(session, "a100")


def test_the_recalls_for_a_request_are_found_without_the_pool_s_history(
    database: Database,
) -> None:
    """Active leases recalled for the request, and those preempted for it since it was made;
    not a recall for another request, nor a preemption before the request existed."""
    with database.write() as session:
        ids = a_fleet(session)
        active = a_lease(session, at=START, gpu_ids=ids[:1], marks=recalled(9))
        a_lease(session, at=START, gpu_ids=ids[1:2], marks=recalled(8))
        taken = a_lease(session, at=START, gpu_ids=ids[2:3], state="reclaimed", marks=recalled(9))
        old = a_lease(session, at=START, gpu_ids=ids[3:4], state="reclaimed", marks=recalled(9))
        for lease_id, ended in ((taken, NOW), (old, START - timedelta(days=1))):
            row = leases.get(session, lease_id)
            assert row is not None
            row.end_reason, row.ended_at = "preempted", ended
            session.add(row)
    with database.read() as session:
        assert [active, taken] == leases.recalled_for(session, "a100", 9, START)
        assert [] == leases.recalled_for(session, "l40s", 9, START)


def test_the_slots_of_many_leases_are_those_of_each(database: Database) -> None:
    """One read for a list of leases gives what `slots_of` gives for each."""
    with database.write() as session:
        ids = a_fleet(session)
        held = a_lease(session, at=START, gpu_ids=ids[:2])
        ended = a_lease(session, at=START, gpu_ids=ids[2:4], state="released")
    with database.read() as session:
        each = {lease: sorted(leases.slots_of(session, lease)) for lease in (held, ended)}
        many = leases.slots_of_each(session, [held, ended])
        assert each == {lease: sorted(slots) for lease, slots in many.items()}
        assert {} == leases.slots_of_each(session, [])


def test_status_counts_are_grouped_in_sql(database: Database) -> None:
    """Free, leased, out (drained or unhealthy) per pool and model; and the free GPUs on nodes
    too empty for a request."""
    with database.write() as session:
        ids = a_fleet(session)
        a_lease(session, at=START, gpu_ids=ids[:1])
    with database.read() as session:
        counts = sorted(gpus.place_counts(session), key=lambda c: (c.place, c.drained))
        free = gpus.free_gpus(session, "a100")
        assert 3 == gpus.stranded(session, "a100", 4)
        assert 0 == gpus.stranded(session, "a100", 3)
    assert [
        PlaceCount("a100", "A100", Place.FREE, False, 3),
        PlaceCount("a100", "A100", Place.LEASED, False, 1),
        PlaceCount("a100", "A100", Place.OUT, False, 1),
        PlaceCount("a100", "A100", Place.OUT, True, 2),
    ] == counts
    assert {"node-01": [1, 2, 3]} == free
    assert {("node-01", 1), ("node-01", 2), ("node-01", 3)} == free.unknown  # never observed


def test_only_cards_with_no_redraw_on_its_way_owe_one(database: Database) -> None:
    """A pending request's card owes a redraw unless one is pending or being sent."""
    with database.write() as session:
        made = []
        for route in ("C1", "C1", "C1", ""):
            row = RequestRow(
                kind="borrow",
                requester="U1",
                team="vision",
                pool="a100",
                gpus=1,
                duration_s=3600,
                state="pending",
                outcome="ask",
                approval_route=route,
                created_at=START,
            )
            session.add(row)
            session.flush()
            made.append(row.id)
        data = {"request": made[1]}
        owe(session, Owed(OutboxKind.CARD_SETTLED, f"request:{made[1]}", "cards", data), at=NOW)
    kind, ways = OutboxKind.CARD_SETTLED, ["pending", "sending"]
    with database.read() as session:
        assert [made[0], made[2]] == requests.cards_to_redraw(session, "a100", kind, ways, None)
        assert [made[2]] == requests.cards_to_redraw(session, "a100", kind, ways, made[0])


# ---- the plans SQLite chooses --------------------------------------------------------------


@contextmanager
def statements(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """The SQL statements run on `db` meanwhile, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def note(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    sa.event.listen(db.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", note)


def plans(db: Database, read: Callable[[Session], object]) -> list[str]:
    """SQLite's EXPLAIN QUERY PLAN of every statement `read` runs, one text each."""
    with db.read() as session, statements(db) as seen:
        read(session)
    out = []
    with db.engine.connect() as connection:
        raw: Any = connection.connection.driver_connection
        for statement, parameters in seen:
            rows = raw.execute(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
            out.append("\n".join(str(row[-1]) for row in rows))
    return out


@pytest.fixture
def sqlite_fleet() -> Iterator[Database]:
    db = Database("sqlite://")
    db.create_all()
    with db.write() as session:
        ids = a_fleet(session)
        a_lease(session, at=START, gpu_ids=ids[:2], marks=recalled(5))
        for _ in range(3):  # history: ended leases keep their (inactive) lease GPUs
            a_lease(session, at=START, gpu_ids=ids[:4], state="released")
    yield db
    db.dispose()


HELD_READS: dict[str, Callable[[Session], object]] = {
    "gpu_lines": gpus.gpu_lines,
    "gpu_snapshots": gpus.gpu_snapshots,
    "held_gpus": leases.held_gpus,
    "active_snapshots": leases.active_snapshots,
    "pool_leases": lambda s: leases.pool_leases(s, "a100"),
    "usable_gpus": lambda s: leases.usable_gpus(s, [1, 2]),
    "held_seen": lambda s: leases.held_seen(s, 1),
}


BY_LEASE = frozenset({"usable_gpus", "held_seen", "pool_leases"})  # held GPUs of given leases


@pytest.mark.parametrize("name", sorted(HELD_READS))
def test_held_lease_gpus_are_read_through_the_partial_index(
    sqlite_fleet: Database, name: str
) -> None:
    """No read of the GPUs held now scans lease_gpu (every lease's GPUs, ever) or builds an
    index of it on the fly: it finds them through ix_lease_gpu_active (`WHERE active`), or by
    lease id through the primary key."""
    lines = [
        line
        for plan in plans(sqlite_fleet, HELD_READS[name])
        for line in plan.splitlines()
        if "lease_gpu" in line
    ]
    assert lines, f"{name} read no lease_gpu"
    for line in lines:
        if name in BY_LEASE:
            assert "AUTOMATIC" not in line, line
            assert "(lease_id=?" in line, line
        else:
            assert "USING INDEX ix_lease_gpu_active" in line, line


#: Reads that ask only whether a GPU is held, of `gpu.held`.
COUNTED_READS: dict[str, Callable[[Session], object]] = {
    "free_gpus": lambda s: gpus.free_gpus(s, "a100"),
    "place_counts": gpus.place_counts,
    "stranded": lambda s: gpus.stranded(s, "a100", 2),
    "free_per_node": lambda s: gpus.free_per_node(s, "a100"),
    "free_count": lambda s: gpus.free_count(s, "a100"),
    "best_fit": lambda s: gpus.best_fit(s, "a100", 1),
}


@pytest.mark.parametrize("name", sorted(COUNTED_READS))
def test_free_gpus_and_status_counts_read_no_lease(sqlite_fleet: Database, name: str) -> None:
    """Counting the free GPUs, or where every GPU stands, reads the GPU index (which holds
    `held`), never the leases: no probe of the lease index for each GPU."""
    found = plans(sqlite_fleet, COUNTED_READS[name])
    assert not [plan for plan in found if "lease" in plan], found
    assert any("ix_gpu_pool_held_state_observed_model" in plan for plan in found), found


INDEXED_READS: list[tuple[str, Callable[[Session], object]]] = [
    ("ix_lease_end_reason_ended_at", lambda s: leases.last_preempted_since(s, START)),
    ("ix_lease_end_reason_ended_at", lambda s: leases.recalled_for(s, "a100", 5, START)),
    ("ix_lease_recalled", lambda s: leases.recalled_for(s, "a100", 5, START)),
    ("ix_lease_recalled", lambda s: leases.any_recalled(s, "a100")),
    ("ix_lease_recalled", lambda s: leases.pool_leases(s, "a100")),
    ("ix_request_lease_id", lambda s: requests.ids_for_lease(s, 1)),
    ("ix_lease_holder", lambda s: leases.listed(s, holder="U1")),
    ("ix_lease_holder", lambda s: leases.lock_active_of(s, "U1")),
    ("COVERING INDEX ix_lease_pool_state_team_gpus", lambda s: leases.held_by_team(s, "a100")),
    ("COVERING INDEX ix_gpu_pool_held_state_observed_model", gpus.place_counts),
    ("USING INDEX ix_node_drained", gpus.place_counts),
    ("COVERING INDEX ix_gpu_pool_held (pool=? AND held=?)", gpus.place_counts),
    ("ix_gpu_pool_held_state_observed_model", lambda s: gpus.free_per_node(s, "a100")),
]


@pytest.mark.parametrize(("index", "read"), INDEXED_READS)
def test_cooldown_recall_lease_requests_and_a_person_s_leases_use_their_index(
    sqlite_fleet: Database, index: str, read: Callable[[Session], object]
) -> None:
    """The recall cooldown, the recalls of a request (and whether any is under way), the
    requests of a lease and a person's active leases are found through their index, whatever
    the history holds (or the pool's active leases: the recalled are few of them); quota sums,
    status counts and free GPUs per node read an index that holds all they ask, and status
    finds the drained nodes (few) through theirs."""
    assert any(index in plan for plan in plans(sqlite_fleet, read))


# ---- reads kept for one transaction ---------------------------------------------------------


def a_queued_borrow(session: Session) -> RequestRow:
    row = RequestRow(
        kind="borrow",
        requester="U1",
        team="vision",
        pool="a100",
        gpus=1,
        duration_s=3600,
        state="queued",
        outcome="queue",
        created_at=START,
    )
    session.add(row)
    session.flush()
    return row


def test_a_read_is_kept_while_the_transaction_changes_nothing(database: Database) -> None:
    """Asked again, the read is not made again; a flush, an ORM write statement or a change
    still pending makes it read afresh, so nothing written in the transaction is missed."""
    reads: list[int] = []

    def queued(session: Session) -> int:
        def read() -> int:
            reads.append(1)
            return requests.queued_count(session, "a100")

        return requests.per_transaction(session, "queued", read)

    with database.write() as session:
        assert (0, 0) == (queued(session), queued(session))
        assert 1 == len(reads)
        row = a_queued_borrow(session)  # flushed
        assert 1 == queued(session)
        row.state = "cancelled"
        session.add(row)  # pending: read afresh (its autoflush writes it first)
        assert 0 == queued(session)
        assert 0 == queued(session)
        reads.clear()
        session.exec(sa.update(RequestRow).values(state="queued"))
        assert (1, 1) == (queued(session), queued(session))
        assert 1 == len(reads)
    with database.read() as session:
        assert 1 == queued(session)
