"""A recorded history for the rules simulation, made with the real use cases: three borrows,
their leases' stored minutes, and their releases; and the candidate rules it is replayed
through (a lower idle threshold, stricter request rules)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from bot.services import BorrowAsk, Services
from bot.services.results import BorrowResult, ReleaseResult
from rules.domain import Outcome
from storage.gpus import store_minutes
from storage.tables import GpuMinuteRow
from tests.builders import POLICIES, default_sources

ALICE, BOB, CAROL = "U0ALICE01", "U0BOB0001", "U0CAROL01"

# (file, text in the shipped rules, text in the candidate)
CANDIDATE_EDITS = (
    ("limits.yaml", "idle_threshold: 90m", "idle_threshold: 60m"),
    ("limits.yaml", "max_gpus_per_request: 8", "max_gpus_per_request: 4"),
    ("requests.yaml", "request.duration > 1d", "request.duration > 4h"),
    ("requests.yaml", "is longer than a day", "is longer than 4 hours"),
)


def candidate_sources() -> dict[str, str]:
    sources = default_sources()
    for name, old, new in CANDIDATE_EDITS:
        assert old in sources[name]
        sources[name] = sources[name].replace(old, new, 1)
    return sources


def candidate_dir(tmp_path: Path) -> Path:
    """A copy of the shipped rules with the candidate's edits."""
    copy = tmp_path / "candidate"
    shutil.copytree(POLICIES, copy)
    for name, old, new in CANDIDATE_EDITS:
        path = copy / name
        path.write_text(path.read_text(encoding="utf-8").replace(old, new, 1), encoding="utf-8")
    return copy


def _lease(services: Services, user: str, ask: BorrowAsk) -> int:
    result = services.borrow(user, ask)
    assert isinstance(result, BorrowResult), result
    assert Outcome.APPROVE == result.outcome, result
    assert result.lease is not None
    return result.lease.id


def _minutes(services: Services, lease: int, util: Callable[[int], float], count: int) -> None:
    view = services.lease(lease)
    assert view is not None
    start = view.granted_at.replace(second=0, microsecond=0)
    rows = [
        GpuMinuteRow(
            node=slot.node,
            index=slot.index,
            minute=start + timedelta(minutes=m),
            util_avg_pct=util(m),
            util_max_pct=util(m),
            memory_used_max_mib=1024,
            samples=2,
            ok_samples=2,
        )
        for slot in view.gpus
        for m in range(count)
    ]
    with services.db.write() as session:
        store_minutes(session, rows)


def record_history(services: Services, advance: Callable[[timedelta], None]) -> tuple[int, ...]:
    """At the clock's now: Alice borrows 2 a100 for 6h and leaves them idle, releasing them
    after 100 minutes; Bob borrows 1 l40s for 2h and Carol 6 a100 for 3h, both busy, released
    after 60 and 30 minutes. Every borrow is approved at once by the shipped rules. Returns
    the leases (Alice's, Bob's, Carol's)."""
    alice = _lease(services, ALICE, BorrowAsk("a100", 2, timedelta(hours=6), reason="ablation"))
    bob = _lease(services, BOB, BorrowAsk("l40s", 1, timedelta(hours=2), reason="eval"))
    carol = _lease(services, CAROL, BorrowAsk("a100", 6, timedelta(hours=3), reason="pretrain"))
    _minutes(services, alice, lambda m: 0.0, 100)
    _minutes(services, bob, lambda m: 90.0, 60)
    _minutes(services, carol, lambda m: 70.0, 30)
    for minutes, user, lease in ((30, CAROL, carol), (30, BOB, bob), (40, ALICE, alice)):
        advance(timedelta(minutes=minutes))
        released = services.release(user, lease)
        assert isinstance(released, ReleaseResult), released
    return alice, bob, carol
