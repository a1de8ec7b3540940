"""The lease repository: what active leases hold, the sweep's snapshot, and the locks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import Session, col

from rules.fairshare import Interval
from rules.marks import Marks
from storage import leases, outbox, sweep_reads
from storage.db import Database
from storage.outbox import OutboxKind, Owed
from storage.tables import GpuRow, NodeRow, PoolRow
from tests.unit.storage.builders import a_lease

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=1)  # the leases were granted an hour ago, for six hours


def a_fleet(session: Session) -> list[int]:
    """Pool a100 with one node of four GPUs; their ids."""
    session.add(PoolRow(name="a100"))
    session.flush()
    node = NodeRow(name="a100-node-01", pool="a100")
    session.add(node)
    session.flush()
    assert node.id is not None
    gpus = [GpuRow(node_id=node.id, index=i, pool="a100") for i in range(4)]
    session.add_all(gpus)
    session.flush()
    return [g.id for g in gpus if g.id is not None]


def test_what_active_leases_hold(database: Database) -> None:
    """GPUs per team, per GPU, and each lease's slots; ended leases hold nothing."""
    with database.write() as session:
        gpus = a_fleet(session)
        first = a_lease(session, at=START, gpu_ids=gpus[:2])
        second = a_lease(session, at=START, gpu_ids=gpus[2:3], holder="U2", team="nlp")
        a_lease(session, at=START, gpu_ids=gpus[3:], holder="U3", team="nlp", state="released")
    with database.read() as session:
        assert {"vision": 2, "nlp": 1} == leases.held_by_team(session, "a100")
        assert {gpus[0]: first, gpus[1]: first, gpus[2]: second} == {
            gpu: lease for gpu, (lease, _, _) in leases.held_gpus(session).items()
        }
        assert [("a100-node-01", 0), ("a100-node-01", 1)] == sorted(leases.slots_of(session, first))
        assert {first: "U1", second: "U2"} == leases.holders(session, [first, second])
        assert [first, second] == [row.id for row in leases.active_in(session, "a100")]
        assert [first] == [row.id for row in leases.lock_active_of(session, "U1")]


def test_a_lease_locked_only_while_it_is_the_one_read(database: Database) -> None:
    """`lock_active` gives nothing once the lease was extended or ended since it was read."""
    with database.write() as session:
        lease_id = a_lease(session, at=START, gpu_ids=a_fleet(session)[:1])
    expires = NOW + timedelta(hours=5)
    with database.write() as session:
        assert leases.lock_active(session, lease_id, expires) is not None
        assert leases.lock_active(session, lease_id, expires + timedelta(hours=1)) is None
        row = leases.lock(session, lease_id)
        assert row is not None
        row.state = "released"
        session.add(row)
    with database.write() as session:
        assert leases.lock_active(session, lease_id, expires) is None
        assert leases.lock(session, 999) is None


@pytest.mark.parametrize("from_lines", [False, True], ids=["own read", "from the GPU lines"])
def test_the_sweeps_snapshot_knows_which_warnings_were_delivered(
    database: Database, from_lines: bool
) -> None:
    """A warning counts as delivered only once its outbox row is, at the instant it was (to
    the microsecond); the lease's GPUs are the same whether read on their own or taken from
    the sweep's GPU lines."""
    delivered_at = NOW + timedelta(microseconds=120_001)
    with database.write() as session:
        gpus = a_fleet(session)
        sent = outbox.owe(session, Owed(OutboxKind.LEASE_WARNING, "lease:1", "U1", {}), at=NOW)
        waiting = outbox.owe(session, Owed(OutboxKind.LEASE_WARNING, "lease:1", "U1", {}), at=NOW)
        assert sent.id is not None
        assert waiting.id is not None
        marks = (
            Marks()
            .with_warning("expiry", outbox=sent.id, owed_at=NOW, lead_min=60.0)
            .with_warning("idle", outbox=waiting.id, owed_at=NOW, lead_min=0.0)
            .with_recall(at=NOW, request=4, team="nlp", because="b")
        )
        lease_id = a_lease(session, at=START, gpu_ids=gpus[:2], marks=marks)
        sent.state, sent.delivered_at = outbox.DELIVERED, delivered_at
        session.add(sent)
    with database.read() as session:
        if database.dialect == "postgresql":  # times come out in UTC whatever the session's zone
            session.connection().exec_driver_sql("SET LOCAL TIME ZONE 'America/New_York'")
        lines = sweep_reads.gpu_lines(session) if from_lines else None
        snapshots, warned = leases.active_snapshots(session, lines)
        assert leases.any_recalled(session, "a100")
    (snapshot,) = snapshots
    assert (lease_id, marks) == (snapshot.id, snapshot.warnings)
    assert (("a100-node-01", 0), ("a100-node-01", 1)) == snapshot.slots
    assert {"expiry": delivered_at, "idle": None} == dict(warned[lease_id].delivered)
    assert UTC == warned[lease_id].delivered["expiry"].tzinfo  # type: ignore[union-attr]
    assert (START, START + timedelta(hours=6)) == (snapshot.granted_at, snapshot.expires_at)


def test_the_sweeps_snapshot_reads_each_lease_as_the_table_does(database: Database) -> None:
    """The snapshot's plain reads give the values the ORM gives: aware UTC times (to the
    microsecond), the snooze or none, the protection, the marks whether empty or not."""
    odd = NOW + timedelta(microseconds=123_456)
    kept = Marks().with_kept(at=NOW).with_notice("notice:idle", at=NOW)
    with database.write() as session:
        gpus = a_fleet(session)
        plain = a_lease(session, at=odd, gpu_ids=gpus[:1])
        marked = a_lease(session, at=START, gpu_ids=gpus[1:3], marks=kept)
        unheld = a_lease(session, at=START)  # no GPU rows: no slots
        row = leases.get(session, marked)
        assert row is not None
        row.snoozed_until, row.protected = odd + timedelta(hours=1), True
        session.add(row)
    with database.read() as session:
        snapshots, warned = leases.active_snapshots(session)
        rows = {i: leases.get(session, i) for i in (plain, marked, unheld)}
    assert [plain, marked, unheld] == [s.id for s in snapshots]
    for snapshot in snapshots:
        row = rows[snapshot.id]
        assert row is not None
        expected = (row.granted_at, row.expires_at, row.snoozed_until, row.warnings, row.protected)
        got = (
            snapshot.granted_at,
            snapshot.expires_at,
            snapshot.snoozed_until,
            snapshot.warnings,
            snapshot.protected,
        )
        assert expected == got
        assert UTC == snapshot.granted_at.tzinfo == snapshot.expires_at.tzinfo
        assert {} == dict(warned[snapshot.id].delivered)
    assert (odd, True, kept) == (
        snapshots[0].granted_at,
        snapshots[1].protected,
        snapshots[1].warnings,
    )
    assert () == snapshots[2].slots


def test_what_each_team_held_since_an_instant(database: Database) -> None:
    """Active leases run on; ended ones count from grant to end if they ended since; leases of
    other pools and ones that ended before are left out."""
    since = NOW - timedelta(days=2)
    with database.write() as session:
        gpus = a_fleet(session)
        running = START
        a_lease(session, at=running, gpu_ids=gpus[:2])
        ended = {
            "recent": (NOW - timedelta(days=3), NOW - timedelta(days=1)),
            "old": (NOW - timedelta(days=5), NOW - timedelta(days=4)),
        }
        for holder, (granted, ended_at) in ended.items():
            lease_id = a_lease(session, at=granted, holder=holder, team="nlp", state="released")
            row = leases.get(session, lease_id)
            assert row is not None
            row.ended_at = ended_at
        elsewhere = leases.get(session, a_lease(session, at=START, team="nlp"))
        assert elsewhere is not None
        elsewhere.pool = "l40s"
        session.flush()
        assert [
            Interval("nlp", 1, *ended["recent"]),
            Interval("vision", 2, running, None),
        ] == leases.held_since(session, "a100", since)
        assert [] == leases.held_since(session, "h100", since)


def test_gpus_written_together_are_locked_in_id_order_first(database: Database) -> None:
    """`lock_gpus` row-locks exactly the GPUs named, on PostgreSQL, so that a grant or release
    (whose `held` triggers write GPU rows) and the device observer wait on each other in one
    order; another transaction can still lock the GPUs not named. SQLite writers are serial:
    nothing to lock."""
    with database.write() as session:
        gpus = a_fleet(session)
    with database.write() as session:
        leases.lock_gpus(session, [gpus[2], gpus[0], gpus[2]])
        if database.dialect != "postgresql":
            return
        with database.engine.connect() as other:
            probe = "SELECT id FROM gpu WHERE id = :id FOR NO KEY UPDATE NOWAIT"
            assert other.execute(sa.text(probe), {"id": gpus[1]}).all()
            other.rollback()
            for taken in (gpus[0], gpus[2]):
                with pytest.raises(sa.exc.OperationalError, match="could not obtain lock"):
                    other.execute(sa.text(probe), {"id": taken})
                other.rollback()


def test_gpus_named_by_a_query_are_locked_by_it(database: Database) -> None:
    """A release names its GPUs by a query (`let_go`): they are locked in the one statement."""
    with database.write() as session:
        gpus = a_fleet(session)
    if database.dialect != "postgresql":
        return
    with database.write() as session:
        leases.lock_gpus(session, sa.select(col(GpuRow.id)).where(col(GpuRow.id) == gpus[1]))
        with database.engine.connect() as other:
            probe = "SELECT id FROM gpu WHERE id = :id FOR NO KEY UPDATE NOWAIT"
            assert other.execute(sa.text(probe), {"id": gpus[0]}).all()
            other.rollback()
            with pytest.raises(sa.exc.OperationalError, match="could not obtain lock"):
                other.execute(sa.text(probe), {"id": gpus[1]})


def a_pool_to_recall_from(session: Session) -> list[int]:
    """Pool a100: four 1-GPU leases of vision (one being recalled, one expiring within the
    hour, one on an unhealthy GPU) and one of nlp, one GPU each; the leases by id."""
    gpus = a_fleet(session)
    node = NodeRow(name="a100-node-02", pool="a100")
    session.add(node)
    session.flush()
    assert node.id is not None
    spare = GpuRow(node_id=node.id, index=0, pool="a100", state="unhealthy")
    session.add(spare)
    session.flush()
    assert spare.id is not None
    recalled = Marks().with_recall(at=NOW, request=7, team="nlp", because="nlp's nominal")
    return [
        a_lease(session, at=START, gpu_ids=gpus[:1], marks=recalled),
        a_lease(session, at=START, gpu_ids=gpus[1:2], lasts=timedelta(minutes=90)),
        a_lease(session, at=START, gpu_ids=gpus[2:3]),
        a_lease(session, at=START, gpu_ids=[spare.id]),
        a_lease(session, at=START, gpu_ids=gpus[3:4], holder="U2", team="nlp"),
    ]


@pytest.mark.parametrize(
    ("teams", "ending", "expected"),
    [
        (None, None, [0, 1, 2, 3, 4]),
        (["nlp"], None, [0, 4]),  # nlp's, and the one being recalled
        (["nlp"], (NOW, NOW + timedelta(minutes=30)), [0, 1, 4]),  # and the one expiring
        ([], (NOW, NOW + timedelta(minutes=30)), [0, 1]),
        ([], None, [0]),
        (["vision"], (NOW + timedelta(minutes=30), NOW + timedelta(hours=1)), [0, 1, 2, 3]),
    ],
)
def test_a_pools_leases_read_in_part_are_those_of_the_whole_read(
    database: Database,
    teams: list[str] | None,
    ending: tuple[datetime, datetime] | None,
    expected: list[int],
) -> None:
    """Only some teams' leases, those being recalled and those expiring in a window: each read
    as the read of every lease reads it."""
    with database.write() as session:
        ids = a_pool_to_recall_from(session)
    with database.read() as session:
        whole = {lease.id: lease for lease in leases.pool_leases(session, "a100")}
        part = leases.pool_leases(session, "a100", teams=teams, ending=ending)
    assert [ids[k] for k in expected] == [lease.id for lease in part]
    assert [whole[lease.id] for lease in part] == part
    assert [1, 1, 1, 0, 1] == [whole[i].usable for i in ids]
    assert whole[ids[0]].marks.recalled_at == NOW


def test_a_pools_ends_are_its_leases_usable_gpus_and_expiries(database: Database) -> None:
    """The timeline's read: the leases being recalled whole, each other one's usable GPUs and
    expiry in order of expiry, two at a time."""
    with database.write() as session:
        ids = a_pool_to_recall_from(session)
    with database.read() as session:
        whole = leases.pool_leases(session, "a100")
        recalled = leases.pool_leases(session, "a100", teams=())
        upto, besides = leases.last_id(session), [lease.id for lease in recalled]
        others: list[tuple[int, datetime, int]] = []
        chunk = leases.ends_by_expiry(session, "a100", upto=upto, besides=besides, limit=2)
        while chunk:
            others += chunk
            chunk = leases.ends_by_expiry(
                session, "a100", upto=upto, besides=besides, after=others[-1][1:], limit=2
            )
    assert [whole[0]] == recalled
    assert ids[0] == recalled[0].id
    expected = sorted((lease.expires_at, lease.id, lease.usable) for lease in whole[1:])
    assert [(usable, at, i) for at, i, usable in expected] == others


def test_a_pools_leases_named_by_thousands_of_ids(database: Database) -> None:
    """Recall names the leases holding borrowed GPUs, one id each, and the timeline leaves out
    those being recalled: thousands of ids (beyond SQLite's 32,766 parameters) read as a few."""
    with database.write() as session:
        ids = a_pool_to_recall_from(session)
    many = [*range(10**6, 10**6 + 40_000), ids[2]]  # ids no lease has, and one that has
    with database.read() as session:
        named = leases.pool_leases(session, "a100", teams=[], ids=many)
        upto = leases.last_id(session)
        left = leases.ends_by_expiry(session, "a100", upto=upto, besides=[*many, ids[0]], limit=9)
    assert [ids[0], ids[2]] == [lease.id for lease in named]  # and the one being recalled
    assert [ids[1], ids[3], ids[4]] == sorted(i for _, _, i in left)


def test_the_sweeps_reads_in_chunks_give_what_one_read_gives(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `between`, the GPU lines and the leases are read a few rows at a time, `between`
    called after each chunk (a pass lets requests go first there); the result is the same."""
    with database.write() as session:
        gpus = a_fleet(session)
        for k, gpu in enumerate(gpus[:3]):
            a_lease(session, at=START, gpu_ids=[gpu], holder=f"U{k}")
        a_lease(session, at=START, gpu_ids=gpus[3:], holder="U9", state="released")
        a_lease(session, at=START, holder="U8")  # holds no GPU row
    monkeypatch.setattr(sweep_reads, "ROWS", 2)
    calls: list[int] = []
    with database.read() as session:
        whole = sweep_reads.gpu_lines(session)
        whole_leases = leases.active_snapshots(session, whole)
        lines = sweep_reads.gpu_lines(session, lambda: calls.append(1))
        read_lines = len(calls)
        chunked = leases.active_snapshots(session, lines, lambda: calls.append(1))
    assert lines == whole
    assert chunked == whole_leases
    assert [s.holder for s in chunked[0]] == ["U0", "U1", "U2", "U8"]
    # 3 held rows and 4 GPU rows, 2 at a time: 2 + 2 chunks, and 2 of the lines made
    assert read_lines == 6
    # 4 lines, 4 leases (their rows, their marks, their snapshots): 2 + 2 + 2 + 2 chunks
    assert len(calls) - read_lines == 8
