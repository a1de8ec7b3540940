"""The reads a sweep's action makes cost the same however big the fleet and however many
messages the pass owed before it: each finds its rows through an index of its own terms."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlmodel import Session

from storage import homes, leases, outbox
from storage.db import Database
from storage.outbox import OutboxKind, Owed
from tests.unit.storage.builders import a_lease
from tests.unit.storage.test_scale_reads import NOW, START, a_fleet, plans


@pytest.fixture
def owed_fleet() -> Iterator[Database]:
    """A small fleet with ended leases behind it and many pending rows about other subjects
    and for other people: what a first pass has owed by its thousandth action."""
    db = Database("sqlite://")
    db.create_all()
    with db.write() as session:
        ids = a_fleet(session)
        a_lease(session, at=START, gpu_ids=ids[:2])
        for _ in range(3):
            a_lease(session, at=START, gpu_ids=ids[:4], state="reclaimed")
        for i in range(50):
            message = Owed(OutboxKind.LEASE_WARNING, f"lease:{100 + i}", f"U{i}", {})
            outbox.owe(session, message, at=NOW)
    yield db
    db.dispose()


ACTION_READS: dict[str, tuple[Callable[[Session], object], str]] = {
    "untaken": (
        lambda s: outbox.untaken(s, "lease:1", OutboxKind.LEASE_REDRAWN),
        "ix_outbox_subject_kind_state",
    ),
    "waiting": (
        lambda s: outbox.waiting(s, OutboxKind.ADMIN_DIGEST, "U1", not_before=NOW),
        "ix_outbox_recipient_kind_state",
    ),
    "home waiting": (lambda s: homes._waiting(s, "U1"), "ix_outbox_recipient_kind_state"),
    "gave_back": (lambda s: leases.gave_back(s, 1), "ix_lease_gpu_gpu_id"),
    "reclaimed_from": (lambda s: leases.reclaimed_from(s, 1, START), "ix_lease_gpu_gpu_id"),
}


@pytest.mark.parametrize("name", sorted(ACTION_READS))
def test_a_sweep_action_s_reads_find_their_rows_through_their_own_index(
    owed_fleet: Database, name: str
) -> None:
    """Not through `state` (every pending row) nor through every active or reclaimed lease."""
    read, index = ACTION_READS[name]
    plan = "\n".join(plans(owed_fleet, read))
    assert f"INDEX {index} " in plan, plan
    assert "ix_outbox_state" not in plan, plan
    assert "ix_lease_state" not in plan, plan
