"""Recall's narrowed picture of a full pool with a long queue plans as the whole one does."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bot.services import Services, queueing
from bot.services import recall as service
from bot.services.rule_files import read_rules_dir
from rules.queueing import Ending, Timeline
from storage import leases
from storage.db import Database
from tests.bench import commands_scale as scenario
from tests.bench.sweep import NOW, insert_leases, plan_nodes, rules_dir


@pytest.fixture
def full_pool(database: Database, tmp_path: Path) -> Services:
    """The `commands_scale --queue` fleet at 200 GPUs: l40s full (platform beyond its nominal,
    vision and nlp just inside theirs), its queue long, and recalls started for it."""
    rng = random.Random(7)
    nodes = plan_nodes(200)
    rules = rules_dir(tmp_path, nodes)
    scenario.with_bench_user(rules)
    services = Services.open(database, read_rules_dir(rules), clock=lambda: NOW)
    insert_leases(database, nodes, rng)
    quotas = services.ctx.policy.pools["l40s"].quotas
    scenario.add_queue(database, rng, {team: quota.nominal for team, quota in quotas.items()})
    services.serve_queue(["l40s"])
    return services


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
    full_pool: Services,
) -> None:
    """Each lease's usable GPUs and end, as the whole read of the pool's leases gives them."""
    ctx = full_pool.ctx
    notice = ctx.policy.recall.notice
    with ctx.db.read() as session:
        ending = []
        for row in leases.pool_leases(session, "l40s"):
            end = row.expires_at
            if row.marks.recalled_at is not None:
                end = min(end, queueing.taken_at(session, row.marks, notice) or NOW + notice)
            ending.append((row.usable, end))
        free, ends = queueing._ends(ctx, session, "l40s", NOW)
    assert sorted(ending) == sorted((e.gpus, e.at) for e in ends)
    line = Timeline(NOW, free, ends)
    before = Timeline(NOW, free, sorted((Ending(g, at) for g, at in ending), key=lambda e: e.at))
    assert [before.available(e.at) for e in ends] == [line.available(e.at) for e in ends]
