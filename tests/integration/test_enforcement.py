"""The `signal` enforcer end to end on the bot's side: the sweep reclaims an expired lease and
writes an order for the holder's processes only; the node's next signed push is answered with
it, signed for the node; the agent's signed results are recorded as `enforce:done`. Around it:
a captured push is refused even after a restart, and a flood of refused pushes leaves one
audit row per known node and none for names nobody knows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import select

from bot.localslack import LocalSlack
from bot.main import Bot, assemble
from bot.settings import Settings
from bot.telemetry.agent_push import Ingest
from bot.telemetry.model import ProcessInfo, Sample, order_signature, sign, to_json
from bot.telemetry.window import TelemetryWindow
from storage.tables import AuditRow, EnforcementRow
from tests.integration.conftest import settings_for, story_with
from tests.integration.story import ALICE, Story

NODE = "a100-node-01"
TOKEN = "9e3b7c1d5a2f4e6b8c0d1e2f3a4b5c6d"  # noqa: S105 - a test fixture, not a credential
STARTED = 1_772_400_000.25  # epoch seconds, as the agent's ProcReader reads them
PROCESSES = (
    ProcessInfo(pid=4100, user="alice", started=STARTED),  # the holder's: targeted
    ProcessInfo(pid=4200, user="bob", started=STARTED),  # someone else's
    ProcessInfo(pid=4300, user="alice"),  # the holder's, but its start time is unknown
)


def samples(indexes: list[int]) -> list[Sample]:
    return [
        Sample(
            node=NODE,
            index=index,
            uuid=f"GPU-{NODE}-{index}",
            model="NVIDIA A100-SXM4-80GB",
            memory_total_mib=81920,
            memory_used_mib=30000,
            util_pct=80.0,
            temperature_c=40.0,
            power_w=90.0,
            health="ok",
            processes=PROCESSES,
            taken_at=datetime.now(UTC),
        )
        for index in indexes
    ]


def signed(
    bot: Bot, body: bytes, nonce: str, *, node: str = NODE, token: str = TOKEN
) -> dict[str, str]:
    stamp = str(int(bot.services.now().timestamp()))
    return {
        "X-Gpubot-Node": node,
        "X-Gpubot-Timestamp": stamp,
        "X-Gpubot-Nonce": nonce,
        "X-Gpubot-Signature": sign(token, stamp, nonce, body),
    }


def settings_with_agents(local: LocalSlack, tmp_path: Path) -> Settings:
    tokens = tmp_path / "agents.yaml"
    tokens.write_text(f"{NODE}: {TOKEN}\n")
    return settings_for(local, tmp_path).model_copy(
        update={"enforcer": "signal", "agent_tokens_file": tokens}
    )


@pytest.fixture
def story(local: LocalSlack, tmp_path: Path) -> Iterator[Story]:
    with story_with(settings_with_agents(local, tmp_path), local) as told:
        yield told


def test_a_reclaim_orders_the_holders_processes_signalled_through_the_agent(story: Story) -> None:
    """Reclaim -> one order for alice's process with its start time -> carried by the push ->
    results recorded as enforce:done."""
    lease = story.borrow(ALICE, "a100", 2, hours=2)
    view = story.bot.services.lease(lease)
    assert view is not None
    assert {NODE} == {slot.node for slot in view.gpus}
    indexes = sorted(slot.index for slot in view.gpus)
    while story.state(lease) != "reclaimed" and story.minute < 200:
        for _ in range(2):
            story.clock.tick(timedelta(seconds=30))
            story.telemetry.observe(samples(indexes))
        story.minute += 1
        story.pass_()
    assert "reclaimed" == story.state(lease)

    with story.bot.db.read() as session:
        orders = list(session.exec(select(EnforcementRow)).all())
        ordered = session.exec(select(AuditRow).where(AuditRow.tag == "enforce:ordered")).one()
    assert [(lease, NODE, "pending", False)] == [
        (o.lease_id, o.node, o.state, o.dry_run) for o in orders
    ]
    target = {"gpu": indexes[0], "pid": 4100, "started": STARTED, "user": "alice"}
    assert [target] == orders[0].targets
    assert {4200, 4300} == {s["pid"] for s in ordered.detail["not_targeted"]}

    ingest = story.bot.ingest
    assert ingest is not None
    body = to_json(samples(indexes))
    status, answer = ingest.handle(signed(story.bot, body, "push-1"), body)
    assert 200 == status
    carried = json.loads(answer)["orders"]
    assert [(orders[0].id, [target], False)] == [
        (o["id"], o["targets"], o["dry_run"]) for o in carried
    ]
    # Signed for this node with its token, and good for ten minutes: what the agent checks.
    expires = int((story.bot.services.now() + timedelta(minutes=10)).timestamp())
    assert [(NODE, expires, True)] == [
        (o["node"], o["expires"], o["signature"] == order_signature(TOKEN, o)) for o in carried
    ]
    again = ingest.handle(signed(story.bot, body, "push-2"), body)
    assert [] == json.loads(again[1])["orders"]  # sent once

    results = {"order": orders[0].id, "results": [{"pid": 4100, "outcome": "terminated"}]}
    raw = json.dumps(results).encode()
    assert 200 == ingest.handle_results(signed(story.bot, raw, "results-1"), raw)[0]
    assert 409 == ingest.handle_results(signed(story.bot, raw, "results-2"), raw)[0]
    with story.bot.db.read() as session:
        done = session.exec(select(AuditRow).where(AuditRow.tag == "enforce:done")).one()
        row = session.get(EnforcementRow, orders[0].id)
    assert row is not None
    assert ("done", f"lease:{lease}", "terminated") == (row.state, done.subject, done.outcome)
    assert results["results"] == done.detail["results"]


def durable_ingest(bot: Bot) -> Ingest:
    """The bot's Ingest with its nonces in the database (spend=services.spend_nonce)."""
    assert bot.ingest is not None
    return Ingest(
        bot.ingest.tokens,
        TelemetryWindow(bot.services.policy.timing.stale_after),
        bot.services.now,
        on_refused=bot.services.record_refused_agent,
        spend=bot.services.spend_nonce,
    )


def test_a_captured_push_is_refused_after_the_bot_restarts(
    story: Story, local: LocalSlack, tmp_path: Path
) -> None:
    """The nonce is spent in the database file: a second bot process over it (its own engine,
    its own memory) refuses the replay while the timestamp would still pass."""
    body = to_json(samples([0]))
    headers = signed(story.bot, body, "captured")
    assert 200 == durable_ingest(story.bot).handle(headers, body)[0]
    story.clock.tick(timedelta(minutes=2))
    restarted = assemble(settings_with_agents(local, tmp_path))
    try:
        status, message = durable_ingest(restarted).handle(headers, body)
    finally:
        restarted.close()
    assert (401, "replayed request (nonce already used)") == (status, message)


def test_a_flood_of_refused_pushes_leaves_one_audit_row_per_known_node(story: Story) -> None:
    """500 pushes forged as a known node and 500 from names nobody knows, as the assembled bot
    takes them: one aggregated `agent:refused` row, for the known node only."""
    ingest = story.bot.ingest
    assert ingest is not None
    body = to_json(samples([0]))
    for k in range(500):
        assert 401 == ingest.handle(signed(story.bot, body, f"a{k}", token="f" * 32), body)[0]
        assert 401 == ingest.handle(signed(story.bot, body, f"b{k}", node=f"gpu-{k}"), body)[0]
    with story.bot.db.read() as session:
        rows = session.exec(select(AuditRow).where(AuditRow.tag == "agent:refused")).all()
    assert [(f"node:{NODE}", "bad signature", 1)] == [
        (r.subject, r.detail["why"], r.detail["count"]) for r in rows
    ]
    assert {"bad-signature": 500, "unknown-node": 500} == ingest.refusals.totals()
