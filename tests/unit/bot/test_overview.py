"""Read-only answers and admin switches: status, quota, queue, home, pause, drain, audit."""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import col

from bot.services import BorrowAsk, Refused, Services
from bot.services.fair_share import pool_shares
from bot.services.results import BorrowResult, Explanation, ModelCount
from rules.domain import GpuState, Observed, Outcome, Priority
from storage.gpus import Place, gpu_lines
from storage.tables import GpuRow, NodeRow
from tests.builders import default_sources
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, ERIN, NADIA, Clock
from tests.unit.storage.builders import a_lease

pytestmark = pytest.mark.usefixtures("services")


def test_status_counts_free_leased_and_out_of_service_by_pool(services: Services) -> None:
    """A lease and a drained node show up in the pool's figures."""
    services.borrow(ALICE, BorrowAsk("l40s", 3))
    assert isinstance(services.drain(ADA, "l40s-node-02"), str)
    l40s = next(p for p in services.status() if p.name == "l40s")
    assert (8, 1, 3, 4) == (l40s.size, l40s.free, l40s.leased, l40s.unhealthy)
    assert "NVIDIA L40S" == l40s.models[0].model
    assert next(p for p in services.status() if p.name == "inference").protected


def test_a_drained_node_takes_no_new_lease(services: Services) -> None:
    """Drain keeps new leases off a node; undrain brings it back."""
    services.drain(ADA, "l40s-node-01")
    result = services.borrow(ALICE, BorrowAsk("l40s", 2))
    assert isinstance(result, BorrowResult)
    assert result.lease is not None
    assert {"l40s-node-02"} == set(result.lease.by_node)
    assert "`l40s-node-01` is back in service." == services.undrain(ADA, "l40s-node-01")
    assert isinstance(services.drain(ALICE, "l40s-node-01"), Refused)
    refused = services.drain(ADA, "l40s-node-9")
    assert isinstance(refused, Refused)
    assert "There is no node `l40s-node-9`" in refused.message


def test_quota_shows_use_against_nominal_and_borrowing(services: Services) -> None:
    """A team's quota per pool with what it holds and borrows."""
    services.borrow(ALICE, BorrowAsk("a100", 8))
    asked = services.borrow(BOB, BorrowAsk("a100", 2))
    assert isinstance(asked, BorrowResult)
    services.approve(ADA, asked.request.id)
    quotas = services.quota("vision")
    assert not isinstance(quotas, Refused)
    a100 = next(q for q in quotas if q.pool == "a100")
    assert (8, 4, 10, 2) == (a100.nominal, a100.borrowing_limit, a100.used, a100.borrowed)
    assert isinstance(services.quota("robots"), Refused)


def vision_and_nlp_used_l40s(services: Services, clock: Clock) -> None:
    """Alice (vision) held 3 L40S for 2 hours, then released them; Carol (nlp) holds 1 since."""
    services.borrow(ALICE, BorrowAsk("l40s", 3))
    services.borrow(CAROL, BorrowAsk("l40s", 1))
    clock.advance(timedelta(hours=2))
    services.release(ALICE)


def test_quota_shows_the_teams_fair_share_and_recent_use(services: Services, clock: Clock) -> None:
    """Weights 1:1:1 in l40s; of the GPU-hours used, vision's 3 GPUs made three quarters."""
    vision_and_nlp_used_l40s(services, clock)
    quotas = services.quota("vision")
    assert not isinstance(quotas, Refused)
    share = next(q for q in quotas if q.pool == "l40s").fair_share
    assert share is not None
    assert (1, 3, timedelta(days=7)) == (share.weight, share.weights, share.half_life)
    assert (1 / 3, 0.75) == pytest.approx((share.weight_share, share.usage_share))
    # 3 GPUs for 2h decaying by half a week: 3 * 168h/ln2 * (1 - 2**(-2/168)) GPU-h
    assert 3 * 168 / math.log(2) * (1 - 2 ** (-2 / 168)) == pytest.approx(share.usage)
    assert all(q.fair_share is None for q in services.home(ALICE).quotas)


def test_every_team_with_a_quota_in_the_pool_gets_a_share(services: Services, clock: Clock) -> None:
    """Lower key first: platform used nothing, nlp less than its third, vision more."""
    vision_and_nlp_used_l40s(services, clock)
    with services.db.read() as session:
        shares = pool_shares(services.ctx, session, "l40s")
        assert {} == pool_shares(services.ctx, session, "h100")
    keys = {team: share.key for team, share in shares.items()}
    assert {"vision": 2.25, "nlp": 0.75, "platform": 0.0} == pytest.approx(keys)


def test_usage_older_than_six_half_lives_is_not_read(services: Services, clock: Clock) -> None:
    """With a 1h half-life, vision's lease that ended 7h ago no longer counts; Carol's runs on."""
    vision_and_nlp_used_l40s(services, clock)
    services.reload_rules(ADA, with_limits("fair_share_half_life: 7d", "fair_share_half_life: 1h"))
    clock.advance(timedelta(hours=7))
    with services.db.read() as session:
        shares = pool_shares(services.ctx, session, "l40s")
    assert (0.0, 1.0) == (shares["vision"].usage_share, shares["nlp"].usage_share)


def test_quota_weights_and_fair_share_off_come_from_the_rules(
    services: Services, clock: Clock
) -> None:
    """vision weighs 2 in l40s: 2 of 4. With a zero half-life, no fair share is shown."""
    vision_and_nlp_used_l40s(services, clock)
    sources = default_sources()
    sources["pools.yaml"] = sources["pools.yaml"].replace(
        "vision:   {nominal: 3, borrowing_limit: 2}",
        "vision:   {nominal: 3, borrowing_limit: 2, weight: 2}",
    )
    services.reload_rules(ADA, sources)
    quotas = services.quota("vision")
    assert not isinstance(quotas, Refused)
    share = next(q for q in quotas if q.pool == "l40s").fair_share
    assert share is not None
    assert (2, 4, 0.5) == (share.weight, share.weights, share.weight_share)
    services.reload_rules(ADA, with_limits("fair_share_half_life: 7d", "fair_share_half_life: 0"))
    quotas = services.quota("vision")
    assert not isinstance(quotas, Refused)
    assert all(q.fair_share is None for q in quotas)
    with services.db.read() as session:
        shares = pool_shares(services.ctx, session, "l40s")
    assert {0.0} == {share.usage for share in shares.values()}


def with_limits(old: str, new: str) -> dict[str, str]:
    """The shipped rule files with one setting of limits.yaml changed."""
    sources = default_sources()
    assert old in sources["limits.yaml"]
    sources["limits.yaml"] = sources["limits.yaml"].replace(old, new)
    return sources


def test_the_queue_orders_by_priority_then_arrival(services: Services, clock: Clock) -> None:
    """High priority waits ahead of normal; equal priority in arrival order."""
    services.borrow(ALICE, BorrowAsk("a100", 8))
    services.borrow(CAROL, BorrowAsk("a100", 6))
    asked = services.borrow("U0DAVE001", BorrowAsk("a100", 2))
    assert isinstance(asked, BorrowResult)
    services.approve(NADIA, asked.request.id)
    first = services.borrow(ERIN, BorrowAsk("a100", 1))
    clock.advance(timedelta(minutes=1))
    second = services.borrow("U0PMGR001", BorrowAsk("a100", 1, priority=Priority.HIGH))
    assert isinstance(first, BorrowResult)
    assert isinstance(second, BorrowResult)
    assert Outcome.QUEUE == first.outcome == second.outcome
    assert [second.request.id, first.request.id] == [r.id for r in services.queue()]


def test_pause_is_for_admins_and_recorded(services: Services) -> None:
    """The kill switch flips only for admins and shows on the home tab."""
    assert isinstance(services.pause(ALICE), Refused)
    assert not services.paused()
    services.pause(ADA)
    assert services.paused()
    assert services.home(ALICE).paused
    services.resume(ADA)
    assert not services.paused()


def test_home_shows_my_leases_requests_and_quota(services: Services) -> None:
    """The App Home brings together what a person holds and waits for."""
    services.borrow(ALICE, BorrowAsk("a100", 2))
    services.borrow(ALICE, BorrowAsk("a100", 8))
    home = services.home(ALICE)
    assert "vision" == home.team
    assert 1 == len(home.leases)
    assert 1 == len(home.requests)
    assert {"a100", "l40s"} == {q.pool for q in home.quotas}
    assert 3 == len(home.pools)
    assert services.home("U0STRANGE").team is None


def test_the_audit_trail_lists_every_row_with_its_hash(services: Services) -> None:
    """audit <id> shows each row of a lease's story, to those allowed."""
    result = services.borrow(ALICE, BorrowAsk("a100", 2))
    assert isinstance(result, BorrowResult)
    assert result.lease is not None
    trail = services.audit(ADA, f"L{result.lease.id}")
    assert isinstance(trail, Explanation)
    assert ["`borrow:approved`", "`lease:granted`"] == [line.split()[4] for line in trail.lines]
    assert all("hash=" in line for line in trail.lines)
    assert isinstance(services.audit(CAROL, f"L{result.lease.id}"), Refused)


def test_status_reports_free_gpus_stranded_where_no_waiting_request_fits(
    services: Services,
) -> None:
    """One free L40S left on a node while a 2-GPU request waits: it is stranded."""
    services.borrow(ALICE, BorrowAsk("l40s", 3))
    services.borrow(CAROL, BorrowAsk("l40s", 3))
    asked = services.borrow(BOB, BorrowAsk("l40s", 1))
    assert isinstance(asked, BorrowResult)
    services.approve(ADA, asked.request.id)
    waiting = services.borrow(ERIN, BorrowAsk("l40s", 2))
    assert isinstance(waiting, BorrowResult)
    assert Outcome.QUEUE == waiting.outcome
    l40s = next(p for p in services.status() if p.name == "l40s")
    assert (1, 1, 1) == (l40s.free, l40s.queued, l40s.stranded)
    assert 0 == next(p for p in services.status() if p.name == "a100").stranded


def test_status_of_thousands_of_gpus_is_their_lines_counted(services: Services) -> None:
    """With thousands of GPUs in every state, model, lease and drained node, each pool's
    counts by model are those of its GPUs' lines counted one by one, and the GPUs named as
    used without a lease are those of the lines."""
    rng = random.Random(16)
    pools = sorted(services.policy.pools)
    models = {pool: (f"{pool}-A", f"{pool}-a", f"Ä-{pool}") for pool in pools}
    with services.db.write() as session:
        db = session.connection()
        nodes: list[dict[str, str | bool]] = [
            {"name": f"big-{k:04d}", "pool": rng.choice(pools), "drained": rng.random() < 0.05}
            for k in range(400)
        ]
        db.execute(sa.insert(NodeRow.__table__), nodes)  # type: ignore[attr-defined]
        ids = dict(db.execute(sa.select(col(NodeRow.name), col(NodeRow.id))).all())
        db.execute(
            sa.insert(GpuRow.__table__),  # type: ignore[attr-defined]
            [
                {
                    "node_id": ids[str(node["name"])],
                    "index": index,
                    "pool": node["pool"],
                    "model": rng.choice(models[str(node["pool"])]),
                    "memory_mib": 0,
                    "state": rng.choice([*GpuState, GpuState.OK, GpuState.OK]).value,
                    "observed": rng.choice(list(Observed)).value,
                    "occupants": rng.choice([[], [{"pid": 7, "user": "dave"}]]),
                }
                for node in nodes
                for index in range(8)
            ],
        )
        big = [line.id for line in gpu_lines(session) if line.node.startswith("big-")]
        taken = rng.sample(big, len(big) // 2)
        for start in range(0, len(taken), 4):
            a_lease(session, at=services.ctx.now(), gpu_ids=taken[start : start + 4])
    with services.db.read() as session:
        lines = gpu_lines(session)
    assert 3200 <= len(lines)
    tally: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for line in lines:
        counted = tally[line.pool][line.model]
        counted[line.place] += 1
        if line.drained and line.place == Place.OUT:
            counted["drained"] += 1
    expected = {
        pool: tuple(
            ModelCount(
                model,
                free=c[Place.FREE],
                leased=c[Place.LEASED],
                unhealthy=c[Place.OUT] + c[Place.SILENT],
                occupied=c[Place.OCCUPIED],
                silent=c[Place.SILENT],
                drained=c["drained"],
            )
            for model, c in sorted(tally[pool].items())
        )
        for pool in pools
    }
    assert expected == {p.name: p.models for p in services.status()}
    unnamed = "an unnamed user"
    unreserved = [
        f"{line.node}:{line.index} by {', '.join(u for u in line.occupants if u) or unnamed}"
        for line in lines
        if line.place == Place.OCCUPIED
    ]
    assert 20 < len(unreserved)
    assert unreserved == services.unreserved()
