"""Fifty people borrow at once: no GPU is ever in two active leases, no team passes its limit."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from sqlmodel import Session, col, select

from bot.services import BorrowAsk, Services, borrowing, grants
from bot.services.approval_lifecycle import AskedAgain, chase
from bot.services.results import BorrowResult, SettleResult
from rules.domain import Outcome
from rules.facts import PoolUsage
from storage import pools
from storage.db import Database
from storage.gpus import FreeGpus
from storage.tables import LeaseGpuRow, LeaseRow
from tests.builders import default_sources
from tests.unit.bot.conftest import ADA, Clock

PEOPLE = [
    "U0ALICE01",
    "U0BOB0001",
    "U0VMGR001",
    "U0CAROL01",
    "U0DAVE001",
    "U0NMGR001",
    "U0ERIN001",
    "U0PMGR001",
]


def test_fifty_concurrent_borrows_never_double_assign_or_exceed_a_quota(
    shared_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Borrows and approvals race; the database and the rules hold every invariant."""
    services = Services.open(shared_db, default_sources())
    read_usage = pools.pool_usage

    def slow_usage(session: Session, pool: str, free: FreeGpus | None = None) -> PoolUsage:
        # Widen the window between reading usage and writing the lease, where races live.
        usage = read_usage(session, pool, free)
        time.sleep(0.003)
        return usage

    monkeypatch.setattr(borrowing, "pool_usage", slow_usage)
    monkeypatch.setattr(grants, "pool_usage", slow_usage)  # approvals decide again
    rng = random.Random(7)
    # Most of the crowd is one team, so stale reads would push it past its limit.
    crowd = [*PEOPLE, *PEOPLE[:3] * 4]
    plans = [(crowd[i % len(crowd)], rng.choice([1, 2, 2, 3])) for i in range(50)]
    results: list[BorrowResult | SettleResult] = []
    errors: list[BaseException] = []
    start = threading.Barrier(50)

    def one(user: str, gpus: int) -> None:
        try:
            start.wait()
            result = services.borrow(user, BorrowAsk("a100", gpus))
            assert isinstance(result, BorrowResult), result
            results.append(result)
            if result.outcome == Outcome.ASK:  # an admin clicks Approve right away
                settled = services.approve(ADA, result.request.id)
                assert isinstance(settled, SettleResult), settled
                results.append(settled)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=plan) for plan in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [] == errors
    with shared_db.read() as session:
        active = session.exec(select(LeaseRow).where(LeaseRow.state == "active")).all()
        gpu_ids = session.exec(
            select(LeaseGpuRow.gpu_id).where(col(LeaseGpuRow.active).is_(True))
        ).all()
    assert len(gpu_ids) == len(set(gpu_ids)), "a GPU is in two active leases"
    assert sum(lease.gpus for lease in active) == len(gpu_ids) <= 16
    held = Counter[str]()
    for lease in active:
        held[lease.team] += lease.gpus
    quotas = services.policy.pools["a100"].quotas
    for team, gpus in held.items():
        assert gpus <= quotas[team].nominal + quotas[team].borrowing_limit, (team, gpus)
    granted = [r for r in results if r.lease is not None]
    assert len(granted) == len(active) > 0
    services.close()


def test_ask_again_clicked_twice_at_once_files_one_request(shared_db: Database) -> None:
    """The expired request is locked while the new one is filed: one click files it, the
    other answers with it."""
    clock = Clock()
    services = Services.open(shared_db, default_sources(), clock=clock)
    try:
        alice = "U0ALICE01"
        old = services.borrow(alice, BorrowAsk("a100", 1, timedelta(days=2), reason="runs"))
        assert isinstance(old, BorrowResult)
        clock.advance(timedelta(days=1))
        chase(services.ctx)
        start = threading.Barrier(2)
        results: list[object] = []

        def click() -> None:
            start.wait()
            results.append(services.ask_again(alice, old.request.id))

        threads = [threading.Thread(target=click) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        filed = [r for r in results if isinstance(r, BorrowResult)]
        again = [r for r in results if isinstance(r, AskedAgain)]
        assert (1, 1) == (len(filed), len(again))
        assert filed[0].request.id == again[0].request.id
        assert [filed[0].request.id] == [r.id for r in services.requests(alice)]  # open ones
    finally:
        services.close()
