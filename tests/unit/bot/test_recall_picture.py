"""Recall's narrowed picture of a full pool with a long queue plans as the whole one does."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlmodel import Session

from bot.services import BorrowAsk, Services, borrowing, queueing
from bot.services import recall as service
from bot.services.context import Context
from bot.services.grants import queue_of
from bot.services.rule_files import read_rules_dir
from rules.domain import LeaseState
from rules.queueing import Ending, Slot, Timeline
from storage import leases
from tests.bench import commands_scale as scenario
from tests.bench.sweep import NOW, insert_leases, plan_nodes, rules_dir
from tests.support.copies import Built


@pytest.fixture(scope="module")
def built_pool(
    database_to_build: Built, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Built, dict[str, str]]:
    """The `commands_scale --queue` fleet at 200 GPUs: l40s full (platform beyond its nominal,
    vision and nlp just inside theirs), its queue long, and recalls started for it; built
    once per module and engine, with the rule files it was built under."""
    rng = random.Random(7)
    nodes = plan_nodes(200)
    rules = rules_dir(tmp_path_factory.mktemp("recall_picture"), nodes)
    scenario.with_bench_user(rules)
    sources = read_rules_dir(rules)
    database = database_to_build.db
    services = Services.open(database, sources, clock=lambda: NOW)
    insert_leases(database, nodes, rng)
    quotas = services.ctx.policy.pools["l40s"].quotas
    scenario.add_queue(database, rng, {team: quota.nominal for team, quota in quotas.items()})
    services.serve_queue(["l40s"])
    services.close()
    database_to_build.freeze()
    return database_to_build, sources


@pytest.fixture
def full_pool(built_pool: tuple[Built, dict[str, str]]) -> Iterator[Services]:
    """The built pool, on this test's own copy of its database."""
    built, sources = built_pool
    with built.copy() as database:
        services = Services.open(database, sources, clock=lambda: NOW)
        yield services
        services.close()


def test_the_plan_from_the_touched_leases_is_the_plan_from_all(full_pool: Services) -> None:
    """Read only the recalled leases and those of teams above their nominal, with or without
    fair share ordering the queue: the same plan, and the same free GPUs coming back soon."""
    ctx = full_pool.ctx
    with ctx.db.read() as session:
        whole = service.picture(ctx, session, "l40s", NOW)
        expected = service.plan_for(ctx, whole, "l40s", NOW)
        for planned in ("read", "shown"):
            part = service.picture(ctx, session, "l40s", NOW, planned=planned)
            assert expected == service.plan_for(ctx, part, "l40s", NOW)
            assert (whole.free, whole.soon) == (part.free, part.soon)
            assert len(part.holdings) < len(whole.holdings)
    assert any(h.recalled_at is not None for h in whole.holdings)
    assert expected.keep or expected.start


def test_the_timeline_from_two_columns_is_the_timeline_from_the_leases(
    full_pool: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each lease's usable GPUs and end, as the whole read of the pool's leases gives them,
    read in chunks in order of when they come back."""
    monkeypatch.setattr(queueing.Ends, "FIRST", 3)
    ctx = full_pool.ctx
    notice = ctx.policy.recall.notice
    with ctx.db.read() as session:
        ending = []
        for row in leases.pool_leases(session, "l40s"):
            end = row.expires_at
            if row.marks.recalled_at is not None:
                end = min(end, queueing.taken_at(session, row.marks, notice) or NOW + notice)
            ending.append((row.usable, end))
        ends = queueing.Ends(ctx, session, "l40s", NOW)
        read = list(ends.ordered())
    assert sorted(ending) == sorted((e.gpus, e.at) for e in read)
    assert sorted(e.at for e in read) == [e.at for e in read]
    line = Timeline(NOW, ends.free, iter(read))
    before = Timeline(NOW, ends.free, [Ending(g, at) for g, at in ending])
    assert [before.available(e.at) for e in read] == [line.available(e.at) for e in read]


def every_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timelines as they were built before: every end of the pool read and added at once."""
    monkeypatch.setattr(queueing.Ends, "FIRST", 10**9)
    lazy = queueing.timeline

    def whole(ctx: Context, session: Session, pool: str, now: datetime) -> Timeline:
        line = lazy(ctx, session, pool, now)
        line.available(now + timedelta(days=10_000))
        return line

    monkeypatch.setattr(queueing, "timeline", whole)
    monkeypatch.setattr(borrowing, "timeline", whole)


@pytest.mark.parametrize("gpus", [1, 3])
def test_the_queue_weighed_on_ends_read_as_needed_is_weighed_as_on_every_end(
    full_pool: Services, monkeypatch: pytest.MonkeyPatch, gpus: int
) -> None:
    """A borrow's place and the requests it would delay, whom each waiting request would
    push back, and each one's expected start: the same with the ends read a few at a time as
    with all of them read first."""
    ctx = full_pool.ctx
    ask = BorrowAsk("l40s", gpus, timedelta(hours=2), reason="bench")

    def weighed() -> tuple[object, list[list[int]], dict[int, Slot]]:
        with ctx.db.read() as session:
            waiting = [row for row, _ in queue_of(ctx, session, "l40s")]
            return (
                borrowing._queue_now(ctx, session, ask, "vision", NOW),
                [queueing.pushed_back(ctx, session, row) for row in waiting[::25]],
                queueing.slots(ctx, session, "l40s"),
            )

    with monkeypatch.context() as patched:
        patched.setattr(queueing.Ends, "FIRST", 2)
        chunked = weighed()
    every_end(monkeypatch)
    assert weighed() == chunked
    assert any(slot.start is not None for slot in chunked[2].values())


def test_a_lease_ended_between_two_chunks_of_ends_moves_none_of_the_others(
    full_pool: Services,
) -> None:
    """The ends are read on from the last expiry and id read, not by count: a lease of the
    first chunk that ends before the next one is read leaves no other lease out."""
    ctx = full_pool.ctx
    with ctx.db.write() as session:
        upto = leases.last_id(session)
        whole = leases.ends_by_expiry(session, "l40s", upto=upto, limit=10**6)
        first = leases.ends_by_expiry(session, "l40s", upto=upto, limit=3)
        ended = leases.get(session, first[0][2])
        assert ended is not None
        ended.state = LeaseState.RELEASED
        session.add(ended)
        rest = leases.ends_by_expiry(
            session, "l40s", upto=upto, after=(first[-1][1], first[-1][2]), limit=10**6
        )
    assert first == whole[:3]
    assert whole[3:] == rest
    assert len(whole) > 6


def test_a_lease_extended_between_two_chunks_of_ends_counts_once(
    full_pool: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease of the first chunk extended before the next one is read (PostgreSQL reads each
    chunk anew) comes again further on: the timeline counts it once, where it was first read."""
    monkeypatch.setattr(queueing.Ends, "FIRST", 3)
    ctx = full_pool.ctx
    with ctx.db.write() as session:
        ends = queueing.Ends(ctx, session, "l40s", NOW)
        whole = leases.ends_by_expiry(
            session, "l40s", upto=leases.last_id(session), besides=ends._besides, limit=10**6
        )
        others = ends._others()
        first = [next(others) for _ in range(3)]
        extended = leases.get(session, whole[0][2])
        assert extended is not None
        extended.expires_at = NOW + timedelta(days=30)
        session.add(extended)
        read = first + list(others)
    assert [(e.gpus, e.at) for e in read] == [(usable, at) for usable, at, _ in whole]
