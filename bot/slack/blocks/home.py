"""The App Home tab: my leases with Extend / Release, my requests, my team's quota per pool,
pool availability, and a notice while automation is paused. At most 100 blocks.
"""

from __future__ import annotations

from typing import Any

from bot.services.results import Home
from bot.slack.blocks.kit import (
    BORROW_OPEN_ACTION,
    MAX_VIEW_BLOCKS,
    Block,
    actions,
    button,
    context,
    divider,
    escape,
    fit,
    header,
    listing,
    section,
)
from bot.slack.blocks.leases import lease_rows
from bot.slack.blocks.overview import QUOTA_LEGEND, pool_text, quota_line, request_rows

MAX_HOME_LEASES = 15  # two blocks each
MAX_HOME_REQUESTS = 10
MAX_HOME_POOLS = 10
PAUSED_NOTICE = (
    ":double_vertical_bar: *Automation is paused.* Nothing is warned or reclaimed "
    "automatically until an admin resumes it; your commands work as usual."
)


def home_view(home: Home) -> dict[str, Any]:
    """The `views.publish` payload for one person's Home tab."""
    blocks: list[Block] = [header("Your GPUs")]
    if home.paused:
        blocks.append(section(PAUSED_NOTICE))
    blocks.append(
        actions(
            "home:borrow",
            button("Borrow GPUs", BORROW_OPEN_ACTION, "open", style="primary"),
        )
    )
    if home.leases:
        blocks += listing(home.leases, lease_rows, MAX_HOME_LEASES, "lease")
    else:
        blocks.append(context("You hold no GPUs right now."))
    if home.requests:
        blocks += [section("*Your open requests*")]
        blocks += listing(home.requests, request_rows, MAX_HOME_REQUESTS, "request")
    blocks += [divider(), *_quota(home)]
    blocks += [divider(), header("Pools")]
    blocks += listing(home.pools, lambda p: [section(pool_text(p))], MAX_HOME_POOLS, "pool")
    if not home.pools:
        blocks.append(context("No pools are configured."))
    return {"type": "home", "blocks": fit(blocks, MAX_VIEW_BLOCKS)}


def _quota(home: Home) -> list[Block]:
    if home.team is None:
        return [
            header("Quota"),
            section("You are in no team yet, so you have no quota. Ask an admin to add you."),
        ]
    lines = [f"*{escape(q.pool)}*: {quota_line(q)}" for q in home.quotas[:20]]
    if len(home.quotas) > 20:
        lines.append(f"…and {len(home.quotas) - 20} more pools: `/gpu quota`.")
    text = "\n".join(lines) or "Your team has no quota in any pool."
    return [header(f"Team {home.team}: quota"), section(text), context(QUOTA_LEGEND)]
