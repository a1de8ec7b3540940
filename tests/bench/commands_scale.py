"""Benchmark: the commands people send, answered with 100 and with 10,000 GPUs, side by side.

Each fleet (8 GPUs a node, GPUs 0-3 of every node in 1-GPU active leases: 1,250 nodes and
5,000 active leases at 10k) lives in its own SQLite file, with a history in proportion to it
(`HISTORY` ended leases per active one, each with its inactive lease_gpu row and its request).
One person of `vision`, who holds nothing else, then borrows, asks why, lists their leases and
releases, through `bot.services.Services`; each command is timed (wall, and this process's
CPU, which the budget mark reads: steadier on a shared machine), median of `RUNS` rounds,
which alternate between the fleets (both open at once, each going first in every other round)
so that a shared machine's drifting load weighs on both alike. With
`--queue`, the l40s pool is full, in the same proportions at both sizes (vision and nlp just
inside their nominal, platform borrowing beyond its own), and `QUEUED` borrows wait for it:
the borrow waits too (and is cancelled), and a lease of l40s is released (the queue's head
is granted).
Run with `python -m tests.bench.commands_scale [--queue]`. Reports figures; never fails.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select, update

from bot.services import BorrowAsk, Refused, Services
from bot.services.rule_files import read_rules_dir
from rules.domain import LeaseState, RequestKind, RequestState
from storage import migrate
from storage.db import Database
from storage.leases import HELD
from storage.tables import GpuRow, LeaseGpuRow, LeaseRow, RequestRow
from tests.bench.sweep import NOW, insert_leases, plan_nodes, rules_dir

FLEETS = (100, 10_000)
RUNS = 7
HISTORY = 20  # ended leases per active lease
QUEUED = 1_000
SPARE = 0.08  # of their nominal, what vision and nlp leave unused in the full l40s pool
RATIO_BUDGET = 1.5
USER = "U0BENCH01"  # a member of vision holding nothing but what the bench borrows


def add_history(db: Database, rng: random.Random) -> None:
    """Ended leases (released, some preempted), each with its GPU row and its request."""
    with db.read() as session:
        active = (
            session.connection()
            .execute(
                sa.select(
                    col(LeaseRow.id),
                    col(LeaseRow.holder),
                    col(LeaseRow.team),
                    col(LeaseRow.pool),
                    col(LeaseGpuRow.gpu_id),
                )
                .join(LeaseGpuRow, col(LeaseGpuRow.lease_id) == col(LeaseRow.id))
                .where(col(LeaseRow.state) == LeaseState.ACTIVE)
            )
            .all()
        )
    leases: list[dict[str, Any]] = []
    for k in range(len(active) * HISTORY):
        _, holder, team, pool, _ = active[k % len(active)]
        start = NOW - timedelta(days=rng.uniform(1, 365))
        preempted = rng.random() < 0.05
        leases.append(
            {
                "holder": holder,
                "team": team,
                "pool": pool,
                "gpus": 1,
                "priority": "normal",
                "protected": False,
                "reason": "history",
                "state": LeaseState.RECLAIMED if preempted else LeaseState.RELEASED,
                "granted_at": start,
                "expires_at": start + timedelta(hours=8),
                "ended_at": start + timedelta(hours=rng.uniform(1, 8)),
                "end_reason": "preempted" if preempted else "released",
                "extensions": 0,
                "extended_s": 0,
                "warnings": {},
                "snoozes": 0,
            }
        )
    with db.write() as session:
        first = session.exec(select(sa.func.max(LeaseRow.id))).one() or 0
        session.execute(sa.insert(LeaseRow.__table__), leases)  # type: ignore[attr-defined]
        links, asks = [], []
        for k, lease in enumerate(leases):
            lease_id = first + 1 + k
            links.append(
                {"lease_id": lease_id, "gpu_id": active[k % len(active)][4], "active": False}
            )
            asks.append(_request(lease, lease_id, RequestState.APPROVED))
        session.execute(sa.insert(LeaseGpuRow.__table__), links)  # type: ignore[attr-defined]
        session.execute(sa.insert(RequestRow.__table__), asks)  # type: ignore[attr-defined]


def _request(lease: dict[str, Any], lease_id: int | None, state: str) -> dict[str, Any]:
    return {
        "kind": RequestKind.BORROW,
        "requester": lease["holder"],
        "team": lease["team"],
        "pool": lease["pool"],
        "gpus": lease["gpus"],
        "duration_s": 8 * 3600,
        "priority": "normal",
        "reason": "history",
        "state": state,
        "outcome": "approve" if lease_id else "queue",
        "approvers": [],
        "approval_route": "",
        "lease_id": lease_id,
        "created_at": lease["granted_at"],
        "decided_at": lease["granted_at"] if lease_id else None,
        "decided_by": "gpubot" if lease_id else None,
        "reminders": 0,
    }


def add_queue(db: Database, rng: random.Random, nominal: Mapping[str, int]) -> list[int]:
    """The l40s pool full, in the same proportions at every fleet size: RUNS + 1 of vision's
    leases become the bench person's (one a round to release), vision and nlp get free GPUs up
    to `SPARE` short of their nominal (so that their waiting borrows are inside it, and recall
    works for them) and platform the rest (borrowing beyond its nominal); then QUEUED 1-GPU
    borrows wait, for up to half a day. The bench person's leases, by id."""
    with db.read() as session:
        free = session.exec(
            select(GpuRow.id)
            .outerjoin(LeaseGpuRow, sa.and_(col(LeaseGpuRow.gpu_id) == col(GpuRow.id), HELD))
            .where(GpuRow.pool == "l40s", col(LeaseGpuRow.lease_id).is_(None))
            .order_by(col(GpuRow.id))
        ).all()
        first = session.exec(select(sa.func.max(LeaseRow.id))).one() or 0
        held = dict(
            session.exec(
                select(LeaseRow.team, sa.func.count())
                .where(LeaseRow.pool == "l40s", LeaseRow.state == LeaseState.ACTIVE)
                .group_by(col(LeaseRow.team))
            ).all()
        )
        mine = list(
            session.exec(
                select(LeaseRow.id)
                .where(
                    LeaseRow.pool == "l40s",
                    LeaseRow.team == "vision",
                    LeaseRow.state == LeaseState.ACTIVE,
                )
                .order_by(col(LeaseRow.id))
                .limit(RUNS + 1)
            ).all()
        )
    assert len(mine) == RUNS + 1, mine
    teams = (("vision", "U0ALICE01"), ("nlp", "U0CAROL01"), ("platform", "U0ERIN001"))
    lenders = [(team, holder) for team, holder in teams if team != "platform"]
    short = {team: int(nominal[team] * (1 - SPARE)) - held.get(team, 0) for team, _ in lenders}
    leases: list[dict[str, Any]] = []
    for k in range(len(free)):
        team, holder = next(
            ((t, h) for t, h in lenders[k % 2 :] + lenders[: k % 2] if short[t] > 0), teams[2]
        )
        short[team] = short.get(team, 0) - 1
        at = NOW - timedelta(hours=rng.uniform(1, 24))
        leases.append(_lease(holder, team, "l40s", at, NOW + timedelta(hours=rng.uniform(1, 72))))
    asks = []
    for k in range(QUEUED):
        team, holder = teams[k % len(teams)]
        at = NOW - timedelta(minutes=rng.uniform(1, 12 * 60))
        lease = {"holder": holder, "team": team, "pool": "l40s", "gpus": 1, "granted_at": at}
        asks.append(_request(lease, None, RequestState.QUEUED))
    with db.write() as session:
        session.exec(update(LeaseRow).where(col(LeaseRow.id).in_(mine)).values(holder=USER))
        session.execute(sa.insert(LeaseRow.__table__), leases)  # type: ignore[attr-defined]
        links = [
            {"lease_id": first + 1 + k, "gpu_id": gpu_id, "active": True}
            for k, gpu_id in enumerate(free)
        ]
        session.execute(sa.insert(LeaseGpuRow.__table__), links)  # type: ignore[attr-defined]
        session.execute(sa.insert(RequestRow.__table__), asks)  # type: ignore[attr-defined]
    return [int(lease_id or 0) for lease_id in mine]


def _lease(
    holder: str, team: str, pool: str, granted_at: datetime, expires_at: datetime
) -> dict[str, Any]:
    return {
        "holder": holder,
        "team": team,
        "pool": pool,
        "gpus": 1,
        "priority": "normal",
        "protected": False,
        "reason": "bench",
        "state": LeaseState.ACTIVE,
        "granted_at": granted_at,
        "expires_at": expires_at,
        "end_reason": "",
        "extensions": 0,
        "extended_s": 0,
        "warnings": {},
        "snoozes": 0,
    }


def with_bench_user(rules: Path) -> None:
    org = rules / "org.yaml"
    text = org.read_text(encoding="utf-8")
    org.write_text(
        text.replace("members: [U0ALICE01, U0BOB0001]", f"members: [U0ALICE01, U0BOB0001, {USER}]"),
        encoding="utf-8",
    )


def timed(run: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds, and this process's CPU seconds (steadier on a shared machine: SQLite
    runs in-process, so they count the queries too)."""
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - t0, time.process_time() - c0


@contextmanager
def a_fleet(gpus: int, *, queue: bool) -> Iterator[tuple[Services, list[int]]]:
    """A fleet of `gpus` GPUs in a SQLite file of its own, its Services open, with the bench
    person's l40s leases (one a round to release) when the l40s queue is built."""
    rng = random.Random(gpus)
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-commands-") as name:
        tmp = Path(name)
        nodes = plan_nodes(gpus)
        url = f"sqlite:///{tmp / 'gpubot.db'}"
        migrate.upgrade(url)
        db = Database(url)
        rules = rules_dir(tmp, nodes)
        with_bench_user(rules)
        services = Services.open(db, read_rules_dir(rules), clock=lambda: NOW)
        try:
            insert_leases(db, nodes, rng)
            add_history(db, rng)
            quotas = services.ctx.policy.pools["l40s"].quotas
            nominal = {team: quota.nominal for team, quota in quotas.items()}
            yield services, add_queue(db, rng, nominal) if queue else []
        finally:
            services.close()
            db.dispose()


def bench_fleets(*, queue: bool) -> list[dict[str, tuple[float, float]]]:
    """Each command's median wall and CPU seconds per fleet of FLEETS. Both fleets stay open
    and the rounds alternate between them, each going first in every other round, so that a
    shared machine's drifting load weighs on both alike."""
    times: list[dict[str, list[tuple[float, float]]]] = [{} for _ in FLEETS]
    with ExitStack() as stack:
        fleets = [stack.enter_context(a_fleet(n, queue=queue)) for n in FLEETS]
        # What building the fleets left is kept out of the commands' collections, as `serve`
        # keeps what start-up built: a full collection over it is not the command's
        gc.collect()
        gc.freeze()
        try:
            for k in range(RUNS + 1):  # the first round warms caches up, and is dropped
                turn = list(zip(fleets, times, strict=True))
                for (services, held), spent in turn[:: -1 if k % 2 else 1]:
                    for command, s in one_round(services, held[k] if held else None).items():
                        spent.setdefault(command, []).append(s)
        finally:
            gc.unfreeze()
    return [
        {
            command: (
                statistics.median(wall for wall, _ in s[1:]),
                statistics.median(cpu for _, cpu in s[1:]),
            )
            for command, s in spent.items()
        }
        for spent in times
    ]


def one_round(services: Services, held: int | None) -> dict[str, tuple[float, float]]:
    """Each command once, timed: without a queue a borrow is granted, then released; with
    one, it waits in the l40s queue and is cancelled, and one of the person's l40s leases is
    released (the queue's head is granted)."""
    pool = "a100" if held is None else "l40s"
    ask = BorrowAsk(pool, 1, timedelta(hours=2), reason="bench")
    got: dict[str, Any] = {}

    def borrow() -> None:
        got["borrow"] = services.borrow(USER, ask)

    spent = {"borrow": timed(borrow)}
    result = got["borrow"]
    assert not isinstance(result, Refused), result
    request = result.request.id
    lease = result.lease.id if result.lease else held
    assert lease is not None, result
    spent["status"] = timed(services.status)
    spent["mine"] = timed(lambda: services.leases(holder=USER))
    spent["why R"] = timed(lambda: services.why(USER, f"R{request}"))
    spent["why L"] = timed(lambda: services.why(USER, f"L{lease}"))
    spent["queue"] = timed(services.queue_explained)
    if result.lease is None:
        spent["cancel"] = timed(lambda: services.cancel(USER, request))
    spent["release"] = timed(lambda: services.release(USER, lease))
    return spent


def main() -> None:
    queue = "--queue" in sys.argv
    small, large = bench_fleets(queue=queue)
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    print(
        f"commands through Services on SQLite, median of {RUNS} rounds alternating between "
        f"the fleets; history {HISTORY} ended leases per active one"
        f"{f'; l40s full, {QUEUED} borrows queued in it' if queue else ''}; load {load}"
    )
    print(
        f"{'command':<10}{'wall 100':>10}{'wall 10k':>10}{'ratio':>7}"
        f"{'cpu 100':>10}{'cpu 10k':>10}{'ratio':>7}  budget {RATIO_BUDGET}x"
    )
    for command in small:
        (wa, ca), (wb, cb) = small[command], large[command]
        mark = "" if cb / ca <= RATIO_BUDGET else "  over"
        print(
            f"{command:<10}{wa * 1000:>8.1f}ms{wb * 1000:>8.1f}ms{wb / wa:>6.2f}x"
            f"{ca * 1000:>8.1f}ms{cb * 1000:>8.1f}ms{cb / ca:>6.2f}x{mark}"
        )


if __name__ == "__main__":
    main()
