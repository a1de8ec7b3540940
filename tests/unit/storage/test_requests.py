"""The request repository: the queue of a pool, what waits, and the locks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlmodel import Session

from rules.domain import RequestKind, RequestState
from storage import requests
from storage.db import Database
from storage.tables import PoolRow, RequestRow
from tests.builders import default_policy
from tests.unit.storage.builders import a_lease

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def a_request(
    session: Session,
    *,
    team: str = "vision",
    gpus: int = 1,
    state: RequestState = RequestState.QUEUED,
    kind: RequestKind = RequestKind.BORROW,
    requester: str = "U1",
    minutes_ago: int = 0,
    lease_id: int | None = None,
) -> int:
    request = RequestRow(
        kind=kind,
        requester=requester,
        team=team,
        pool="a100",
        gpus=gpus,
        duration_s=3600,
        state=state,
        outcome="queue",
        created_at=NOW - timedelta(minutes=minutes_ago),
        lease_id=lease_id,
    )
    session.add(request)
    session.flush()
    assert request.id is not None
    return request.id


def test_what_waits_in_a_pool(database: Database) -> None:
    """Queued requests count; pending and settled ones do not."""
    with database.write() as session:
        session.add(PoolRow(name="a100"))
        session.flush()
        a_request(session, gpus=2)
        a_request(session, gpus=3, team="nlp", requester="U2")
        a_request(session, state=RequestState.PENDING)
        a_request(session, state=RequestState.DENIED)
    with database.read() as session:
        assert requests.any_queued(session, "a100")
        assert not requests.any_queued(session, "l40s")
        assert 2 == requests.queued_count(session, "a100")
        assert [2, 3] == sorted(requests.queued_sizes(session, "a100"))
        assert {"a100"} == requests.pools_with_queue(session)
        assert 2 == len(requests.open_requests_for(session, "U1"))


def test_the_queue_is_in_serving_order(database: Database) -> None:
    """Inside a team's nominal first, then by priority and age (rules.recall.queue_order)."""
    with database.write() as session:
        session.add(PoolRow(name="a100"))
        session.flush()
        older = a_request(session, gpus=12, minutes_ago=10)  # beyond vision's nominal of 8
        newer = a_request(session, gpus=2, team="nlp", requester="U2")
    with database.read() as session:
        ordered = requests.ordered_queue(session, default_policy(), "a100")
    assert [(newer, True), (older, False)] == [(r.id, inside) for r, inside in ordered]


def test_pending_extensions_of_a_lease(database: Database) -> None:
    """The extension waiting for a person is found, and locked for withdrawing."""
    with database.write() as session:
        session.add(PoolRow(name="a100"))
        session.flush()
        lease_id = a_lease(session, at=NOW, lasts=timedelta(hours=1))
        ext = a_request(
            session, kind=RequestKind.EXTEND, state=RequestState.PENDING, lease_id=lease_id
        )
    with database.write() as session:
        assert ext == requests.pending_extension(session, lease_id)
        assert [ext] == [r.id for r in requests.lock_pending_extensions(session, lease_id)]
        locked = requests.lock(session, ext)
        assert locked is not None
        assert requests.lock(session, 999) is None
