"""Observe-only would-haves read back from the audit log, and the minutes of a lease's GPUs
after one (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from rules.observed import Afterwards
from storage import audit
from storage.audit import AuditEntry
from storage.db import Database
from storage.observed import WouldHave, afterwards, would_haves
from storage.tables import GpuMinuteRow, GpuRow, LeaseGpuRow, LeaseRow, NodeRow, PoolRow
from tests.unit.storage.builders import a_lease

T = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def two_gpus(database: Database) -> list[int]:
    with database.write() as session:
        session.add(PoolRow(name="a100"))
        session.flush()
        node = NodeRow(name="n1", pool="a100")
        session.add(node)
        session.flush()
        assert node.id is not None
        rows = [GpuRow(node_id=node.id, index=i, pool="a100") for i in range(2)]
        session.add_all(rows)
        session.flush()
        return [r.id for r in rows if r.id is not None]


def minutes(database: Database, index: int, utils: dict[int, float | None]) -> None:
    """A stored minute per {minute after T: average utilisation (None: no working reading)}."""
    with database.write() as session:
        session.add_all(
            GpuMinuteRow(
                node="n1", index=index, minute=T + m * MINUTE, util_avg_pct=util,
                samples=2, ok_samples=0 if util is None else 2,
            )
            for m, util in utils.items()
        )  # fmt: skip


def test_after_a_would_have_only_the_minutes_the_lease_still_held_count(
    database: Database,
) -> None:
    """GPU 0 held throughout: 60 minutes seen, minute 40 busy (50 %); GPU 1 given back at
    +10m: its 10 idle minutes count, its busy minute 20 does not; a minute without a working
    reading is not seen. Busy 1, seen 60 + 10 - 1, expected 70."""
    gpu0, gpu1 = two_gpus(database)
    with database.write() as session:
        lease = a_lease(session, at=T - timedelta(hours=1), gpu_ids=[gpu0, gpu1])
        given_back = session.get(LeaseGpuRow, (lease, gpu1))
        assert given_back is not None
        given_back.released_at, given_back.active = T + 10 * MINUTE, False
        session.add(given_back)
    minutes(database, 0, {m: (50.0 if m == 40 else 0.0) for m in range(-5, 65)} | {7: None})
    minutes(database, 1, {m: (90.0 if m == 20 else 0.0) for m in range(0, 30)})
    with database.read() as session:
        found = afterwards(session, lease, T, T + timedelta(hours=1), busy_pct=5.0)
    assert Afterwards(busy_minutes=1, ok_minutes=69, expected_minutes=70, held_until=None) == found


def test_a_lease_that_ended_is_read_up_to_its_end(database: Database) -> None:
    """Ended at +30m: 30 minutes expected of each GPU, and it was held until then."""
    gpu0, gpu1 = two_gpus(database)
    with database.write() as session:
        lease = a_lease(session, at=T, gpu_ids=[gpu0, gpu1], state="released")
        row = session.get(LeaseRow, lease)
        assert row is not None
        row.ended_at = T + 30 * MINUTE
        session.add(row)
    with database.read() as session:
        found = afterwards(session, lease, T, T + timedelta(hours=1), busy_pct=5.0)
    assert Afterwards(0, 0, 60, T + 30 * MINUTE) == found


def entry(tag: str, subject: str, **extra: Any) -> AuditEntry:
    return AuditEntry(actor="gpubot", tag=tag, subject=subject, **extra)


def test_would_haves_are_the_observed_rules_each_request_once(database: Database) -> None:
    """Kept: an observed sweep row, a request's decision listing an observed match (once,
    though its queue grant repeats it). Left out: a paused rule's row, a paused recall that
    names no rule, the grant row under the lease, rows outside the window."""
    observed_match = {"would_have": [{"rule": "big", "then": "ask managers", "because": "4"}]}
    rows = [
        (T - MINUTE, entry("sweep:would-have", "lease:9", outcome="would reclaim idle",
                           detail={"rule": "old", "why": "observe"})),
        (T, entry("sweep:would-have", "lease:1", outcome="would reclaim idle",
                  deciding_rule="fast", detail={"rule": "fast", "why": "observe"})),
        (T, entry("sweep:would-have", "lease:1", outcome="would warn idle",
                  detail={"rule": "warn-idle", "why": "paused"})),
        (T, entry("recall:would-have", "lease:2", outcome="would recall",
                  detail={"why": "paused", "text": "…"})),
        (T + MINUTE, entry("borrow:approved", "request:5", outcome="approve",
                           detail=observed_match)),
        (T + MINUTE, entry("lease:granted", "lease:3", outcome="approve", detail=observed_match)),
        (T + 2 * MINUTE, entry("queue:granted", "request:5", outcome="approve",
                               detail=observed_match)),
        (T + timedelta(hours=1), entry("sweep:would-have", "lease:4", outcome="would reclaim idle",
                                       detail={"rule": "fast", "why": "observe"})),
    ]  # fmt: skip
    with database.write() as session:
        for at, row in rows:
            audit.append(session, row, at=at)
    with database.read() as session:
        found = would_haves(session, T, T + timedelta(hours=1))
    assert [
        WouldHave(T, "fast", "reclaim idle", "lease:1"),
        WouldHave(T + MINUTE, "big", "ask managers", "request:5", "approve"),
    ] == found
    assert (1, None) == (found[0].lease_id, found[1].lease_id)
