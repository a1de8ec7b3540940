"""Service views for the Block Kit tests, each overridable by keyword, and the limit checks."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

from bot.services.results import (
    GpuSlot,
    Home,
    LeaseView,
    ModelCount,
    PoolStatus,
    QuotaUse,
    RequestView,
)
from bot.slack.blocks import Message

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
ALICE, BOB, VICTOR = "U0ALICE01", "U0BOB0001", "U0VMGR001"

_LEASE = LeaseView(
    id=7,
    holder=ALICE,
    team="vision",
    pool="a100",
    gpus=(GpuSlot("a100-node-01", 0), GpuSlot("a100-node-01", 1)),
    state="active",
    priority="normal",
    protected=False,
    reason="ablations",
    granted_at=T0,
    expires_at=T0 + timedelta(hours=6),
    extensions=0,
    extended=timedelta(0),
)
_REQUEST = RequestView(
    id=12,
    kind="borrow",
    requester=ALICE,
    team="vision",
    pool="a100",
    gpus=2,
    duration=timedelta(hours=6),
    priority="normal",
    reason="ablations",
    state="pending",
    outcome="ask managers",
    approvers=(VICTOR,),
    approval_route="C0APPROVE",
    lease_id=None,
    created_at=T0,
)


def a_lease(**overrides: Any) -> LeaseView:
    """Alice's L7: GPUs 0 and 1 on a100-node-01, granted at T0 for 6h."""
    return replace(_LEASE, **overrides)


def a_request(**overrides: Any) -> RequestView:
    """Alice's pending R12: 2 a100 for 6h, asked of Victor in the approvals channel."""
    return replace(_REQUEST, **overrides)


def a_quota(**overrides: Any) -> QuotaUse:
    base = QuotaUse(
        team="vision", pool="a100", nominal=4, borrowing_limit=4, lending_limit=2, used=3
    )
    return replace(base, **overrides)


def a_pool(**overrides: Any) -> PoolStatus:
    models = (ModelCount("NVIDIA A100-SXM4-80GB", free=10, leased=4, unhealthy=2),)
    base = PoolStatus(name="a100", protected=False, size=16, models=models, queued=3)
    return replace(base, **overrides)


def a_home(**overrides: Any) -> Home:
    base = Home(
        user=ALICE,
        team="vision",
        leases=(a_lease(),),
        requests=(a_request(),),
        quotas=(a_quota(), a_quota(pool="l40s", used=0)),
        pools=(a_pool(), a_pool(name="l40s", protected=True)),
    )
    return replace(base, **overrides)


def validate_blocks(blocks: list[dict[str, Any]]) -> None:
    """Each block parses as slack_sdk's model and passes its validators."""
    for raw in blocks:
        block = Block.parse(raw)
        assert block is not None, raw
        block.validate_json()


def _check_block(block: dict[str, Any]) -> None:
    kind = block["type"]
    if kind == "header":
        assert 0 < len(block["text"]["text"]) <= 150
    if kind == "section":
        assert "text" in block or "fields" in block
        assert len(block.get("text", {}).get("text", "")) <= 3000
        assert len(block.get("fields", [])) <= 10
        assert all(len(f["text"]) <= 2000 for f in block.get("fields", []))
    if kind == "context":
        assert 0 < len(block["elements"]) <= 10
    elements = block.get("elements", []) if kind == "actions" else [block.get("accessory") or {}]
    assert len(elements) <= 25
    buttons = [e for e in elements if e.get("type") == "button"]
    assert all(0 < len(b["text"]["text"]) <= 75 for b in buttons)
    ids = [e["action_id"] for e in elements if "action_id" in e]
    assert len(ids) == len(set(ids)), "action_ids repeat within a block"


def assert_within_limits(surface: Message | dict[str, Any]) -> None:
    """Slack's limits for a message (50 blocks) or a view (100 blocks; modal labels <= 24)."""
    if isinstance(surface, Message):
        assert surface.text.strip()
        assert len(surface.text) <= 3000
        blocks, limit = surface.blocks, 50
    else:
        View(**surface).validate_json()
        blocks, limit = surface["blocks"], 100
        for key in ("title", "submit", "close"):
            assert len(surface.get(key, {}).get("text", "")) <= 24
        assert len(surface.get("private_metadata", "")) <= 3000
    assert 0 < len(blocks) <= limit
    validate_blocks(blocks)
    block_ids = [b["block_id"] for b in blocks if "block_id" in b]
    assert len(block_ids) == len(set(block_ids)), "block_ids repeat"
    for block in blocks:
        _check_block(block)


def texts_of(surface: Message | dict[str, Any]) -> str:
    """Every text a person could read, joined: the fallback, sections, fields, contexts."""
    blocks = surface.blocks if isinstance(surface, Message) else surface["blocks"]
    out = [surface.text] if isinstance(surface, Message) else []
    for block in blocks:
        out.append(block.get("text", {}).get("text", ""))
        out += [f["text"] for f in block.get("fields", [])]
        out += [e.get("text", "") for e in block.get("elements", []) if block["type"] == "context"]
    return "\n".join(out)
