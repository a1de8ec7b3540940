"""The App Home tab, by role. Everyone: my leases with Extend / Release, my requests (a queued
one with its place), my team's quota per pool, my last 7 days, and the pools. A manager also:
what waits for their Approve / Deny and their teams' leases and requests. An admin also: the
fleet (pools, drained and not-reporting nodes, use without a lease, the queue) and the pause
switch. At most 100 blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.services.results import Fleet, Home, LeaseView, RequestView, TeamWork, WeekUse
from bot.slack.blocks.kit import (
    APPROVE_ACTION,
    BORROW_OPEN_ACTION,
    DENY_ACTION,
    MAX_VIEW_BLOCKS,
    Block,
    actions,
    button,
    clip,
    context,
    divider,
    escape,
    fit,
    header,
    listing,
    mention,
    plural,
    section,
    slack_date,
)
from bot.slack.blocks.leases import lease_rows
from bot.slack.blocks.overview import (
    QUOTA_LEGEND,
    pool_text,
    quota_line,
    request_rows,
    request_text,
)

MAX_HOME_LEASES = 15  # two blocks each
MAX_HOME_REQUESTS = 10
MAX_HOME_POOLS = 10
MAX_HOME_WAITING = 10  # two blocks each
MAX_LINES = 15  # lines in one section of a list (team leases, the queue, nodes)
PAUSE_ACTION = "automation_pause"
RESUME_ACTION = "automation_resume"
PAUSED_NOTICE = (
    ":double_vertical_bar: *Automation is paused.* Nothing is warned or reclaimed "
    "automatically until an admin resumes it; your commands work as usual."
)
NO_TEAM = "You are in no team yet, so you have no quota. Ask an admin to add you."


def home_view(home: Home) -> dict[str, Any]:
    """The `views.publish` payload for one person's Home tab."""
    # What waits for the person's decision comes first: it is what holds others up.
    blocks: list[Block] = [*_waiting(home.waiting), divider()] if home.waiting else []
    blocks.append(header("Your GPUs"))
    if home.paused and not home.admin:
        blocks.append(section(PAUSED_NOTICE))
    if home.admin:
        blocks.append(pause_switch(home.paused))
    blocks.append(
        actions(
            "home:borrow",
            button("Borrow GPUs", BORROW_OPEN_ACTION, "open", style="primary"),
        )
    )
    blocks += _mine(home)
    blocks += [divider(), *_quota(home)]
    for team in home.managed:
        blocks += [divider(), *_team(team)]
    if home.fleet is not None:
        blocks += [divider(), *_fleet(home, home.fleet)]
    else:
        blocks += [divider(), header("Pools")]
        blocks += listing(home.pools, lambda p: [section(pool_text(p))], MAX_HOME_POOLS, "pool")
        if not home.pools:
            blocks.append(context("No pools are configured."))
    return {"type": "home", "blocks": fit(blocks, MAX_VIEW_BLOCKS)}


def pause_switch(paused: bool) -> Block:
    """The kill switch: Pause (red, with a confirm) while running, Resume while paused."""
    if paused:
        text = ":double_vertical_bar: *Automation is paused.* Sweeps record what they would do."
        switch = button(
            "Resume automation",
            RESUME_ACTION,
            "resume",
            style="primary",
            confirm=(
                "Resume automation?",
                "Sweeps warn and reclaim again as the rules say.",
                "Resume",
            ),
        )
    else:
        text = ":arrow_forward: *Automation is running.* Sweeps warn and reclaim as the rules say."
        switch = button(
            "Pause automation",
            PAUSE_ACTION,
            "pause",
            style="danger",
            confirm=(
                "Pause automation?",
                "Nothing is warned or reclaimed automatically until you resume; every "
                "automatic action is recorded as “would have” instead.",
                "Pause",
            ),
        )
    return section(text, accessory=switch, block_id="home:automation")


def _mine(home: Home) -> list[Block]:
    blocks: list[Block] = []
    if home.leases:
        blocks += listing(home.leases, lease_rows, MAX_HOME_LEASES, "lease")
    else:
        blocks.append(context("You hold no GPUs right now."))
    if home.requests:
        blocks += [section("*Your open requests*")]
        blocks += listing(
            home.requests, lambda r: _my_request(r, home.places), MAX_HOME_REQUESTS, "request"
        )
    if home.week is not None:
        blocks.append(context(week_line(home.week)))
    return blocks


def _my_request(request: RequestView, places: Mapping[int, int]) -> list[Block]:
    rows = request_rows(request)
    place = places.get(request.id)
    if place is not None:
        rows.append(context(f"{_ordinal(place)} in the *{escape(request.pool)}* queue."))
    elif request.state == "pending":
        rows.append(context(f"Waiting for {_approvers(request)}."))
    return rows


def _approvers(request: RequestView) -> str:
    names = [mention(a) for a in request.approvers[:5]]
    if not names:
        return "a manager"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def week_line(week: WeekUse) -> str:
    """Last 7 days: what was held, how much of it was used (where telemetry saw it), what sat
    idle, what no reading covered, and what it cost where pools are priced."""
    usage = week.usage
    if usage.allocated_s <= 0:
        return "Last 7 days: you held no GPUs."
    parts = [f"Last 7 days: you held {_hours(usage.allocated_h)} GPU-hours"]
    if usage.busy_s + usage.idle_s > 0 and usage.efficiency is not None:
        parts.append(
            f"{round(usage.efficiency * 100)} % efficiency ({_hours(usage.used_h)} GPU-h used)"
        )
        if usage.idle_s > 0:
            parts.append(f"{_hours(usage.idle_h)} GPU-h idle")
    if usage.unknown_s > 0:
        parts.append(f"{_hours(usage.unknown_h)} GPU-h with no readings")
    line = ", ".join(parts)
    if week.priced:
        line += f"; cost {usage.cost:,.2f} {escape(week.currency)}"
    return line + "."


def _hours(value: float) -> str:
    return f"{value:.1f}"


def _waiting(waiting: tuple[RequestView, ...]) -> list[Block]:
    blocks: list[Block] = [header("Waiting for you")]
    blocks += listing(waiting, _waiting_rows, MAX_HOME_WAITING, "request")
    return blocks


def _waiting_rows(request: RequestView) -> list[Block]:
    """One request with the approval card's own buttons (same action ids and values), so the
    card's handlers settle it and every card of it is redrawn."""
    value = str(request.id)
    return [
        section(request_text(request, who=True)),
        actions(
            f"waiting:{request.id}",
            button("Approve", APPROVE_ACTION, value, style="primary"),
            button("Deny", DENY_ACTION, value, style="danger"),
        ),
    ]


def _quota(home: Home) -> list[Block]:
    if home.team is None:
        if home.admin:
            return [context("You are in no team: as an admin you see the whole fleet below.")]
        return [header("Quota"), section(NO_TEAM)]
    lines = [f"*{escape(q.pool)}*: {quota_line(q)}" for q in home.quotas[:20]]
    if len(home.quotas) > 20:
        lines.append(f"…and {len(home.quotas) - 20} more pools: `/gpu quota`.")
    text = "\n".join(lines) or "Your team has no quota in any pool."
    return [header(f"Team {home.team}: quota"), section(text), context(QUOTA_LEGEND)]


def _team(team: TeamWork) -> list[Block]:
    blocks: list[Block] = [header(f"Team {team.team}: leases and requests")]
    leases = [_team_lease(lease) for lease in team.leases]
    blocks.append(section(_lines(leases, "lease") or "No active leases."))
    if team.requests:
        asked = [request_text(r, who=True).split("\n")[0] for r in team.requests]
        blocks.append(section(_lines(asked, "request")))
    return blocks


def _team_lease(lease: LeaseView) -> str:
    return (
        f"*{lease.code}* · {mention(lease.holder)} · {plural(len(lease.gpus), 'GPU')} in "
        f"*{escape(lease.pool)}* · ends {slack_date(lease.expires_at)}"
    )


def _lines(lines: list[str], noun: str) -> str:
    shown = lines[:MAX_LINES]
    if len(lines) > MAX_LINES:
        shown.append(f"…and {plural(len(lines) - MAX_LINES, 'more ' + noun)}.")
    return clip("\n".join(shown), 2900)


def _fleet(home: Home, fleet: Fleet) -> list[Block]:
    pools = [
        f"*{escape(p.name)}*{' · protected' if p.protected else ''} · {p.size} GPUs: "
        f"{p.leased} leased · *{p.free} free* · {p.drained} drained"
        + (f" · {p.silent} not reporting" if p.silent else "")
        + (f" · {p.queued} queued" if p.queued else "")
        for p in home.pools
    ]
    blocks: list[Block] = [
        header("Fleet"),
        section(_lines(pools, "pool") or "No pools are configured."),
    ]
    nodes = []
    if fleet.drained:
        nodes.append("*Drained:* " + ", ".join(f"`{escape(n)}`" for n in fleet.drained))
    if fleet.silent:
        nodes.append("*Not reporting:* " + ", ".join(f"`{escape(n)}`" for n in fleet.silent))
    blocks.append(section("\n".join(nodes) if nodes else "Every node is in service and reporting."))
    if fleet.unreserved:
        used = [
            f"`{escape(g.node)}` GPU {g.index} ({escape(g.pool)})"
            + (f" · {escape(', '.join(u for u in g.users if u))}" if any(g.users) else "")
            for g in fleet.unreserved
        ]
        blocks.append(section("*In use without a lease*\n" + _lines(used, "GPU")))
    queued = [request_text(r, who=True).split("\n")[0] for r in fleet.queue]
    blocks.append(section("*The queue*\n" + (_lines(queued, "request") or "Nobody is waiting.")))
    return blocks
