"""The lists people ask for: `mine` (leases and open requests), `status` (pools by model),
`quota` (use per pool with a small bar) and `queue`; their rows are reused by the App Home.
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.services.results import (
    FairShareUse,
    LeaseView,
    PassedOver,
    PoolStatus,
    QueueEntry,
    QuotaUse,
    Recall,
    RequestView,
)
from bot.slack.blocks.kit import (
    CANCEL_ACTION,
    Block,
    Message,
    button,
    clip,
    context,
    escape,
    header,
    listing,
    mention,
    message,
    plural,
    request_block,
    section,
    slack_date,
)
from bot.slack.blocks.leases import lease_rows
from rules.approvals import SHOWN_REASON
from rules.domain import format_duration

QUOTA_LEGEND = "█ in use within nominal · ▓ borrowed beyond it · ░ room left"
FAIR_SHARE_LEGEND = (
    "Fair share: among requests waiting beyond their team's nominal, the team whose recent use "
    "is furthest below its weight's share goes first."
)


def quota_bar(quota: QuotaUse, width: int = 10) -> str:
    """Use against what the team may hold at most (nominal plus its borrowing limit)."""
    capacity = max(quota.nominal + quota.borrowing_limit, quota.used, 1)
    own = round(min(quota.used, quota.nominal) * width / capacity)
    borrowed = min(round(quota.borrowed * width / capacity), width - own)
    return "█" * own + "▓" * borrowed + "░" * (width - own - borrowed)


def quota_line(quota: QuotaUse) -> str:
    line = f"`{quota_bar(quota)}` {quota.used} in use of {quota.nominal} guaranteed"
    if quota.borrowed:
        line += f", borrowing {quota.borrowed}"
    return line + (
        f" · may borrow up to {quota.borrowing_limit} beyond it · lends up to {quota.lending_limit}"
    )


def fair_share_line(share: FairShareUse) -> str:
    """The team's weight against the pool's and its recent use, in one line."""
    return (
        f"Fair share: weight {share.weight:g} of {share.weights:g} "
        f"({share.weight_share:.0%}); recent use {share.usage_share:.0%} of the pool's "
        f"(half-life {format_duration(share.half_life)})"
    )


def request_text(request: RequestView, *, who: bool = False) -> str:
    length = format_duration(request.duration)
    what = (
        f"extend L{request.lease_id} by {length}"
        if request.kind == "extend"
        else f"{plural(request.gpus, 'GPU')} in *{escape(request.pool)}* for {length}"
    )
    asker = f"{mention(request.requester)} · " if who else ""
    text = f"*{request.code}* · {asker}{what} · {escape(request.state)}"
    text += f" · asked {slack_date(request.created_at)}"
    return text + (f"\n_{clip(escape(request.reason), SHOWN_REASON)}_" if request.reason else "")


def request_rows(request: RequestView) -> list[Block]:
    """One open request with a Withdraw button."""
    withdraw = button(
        "Withdraw",
        CANCEL_ACTION,
        str(request.id),
        confirm=(
            f"Withdraw {request.code}?",
            "Nobody will be asked about it any more.",
            "Withdraw",
        ),
    )
    return [section(request_text(request), accessory=withdraw, block_id=request_block(request.id))]


def mine_message(leases: Sequence[LeaseView], requests: Sequence[RequestView]) -> Message:
    blocks = [header("Your GPUs")]
    if not leases and not requests:
        blocks.append(
            section(
                "You hold no GPUs and have no open requests. "
                "Try `/gpu borrow 2 a100 for 6h because ablations`."
            )
        )
    blocks += listing(leases, lease_rows, 10, "lease")
    if requests:
        blocks += [section("*Open requests*"), *listing(requests, request_rows, 10, "request")]
    text = f"You hold {plural(len(leases), 'lease')} and {plural(len(requests), 'open request')}."
    return message(text, blocks)


def pool_text(pool: PoolStatus) -> str:
    protected = " · protected" if pool.protected else ""
    head = f"*{escape(pool.name)}*{protected} · {plural(pool.size, 'GPU')}: "
    head += f"*{pool.free} free* · {pool.leased} leased"
    if pool.occupied:
        head += f" · {pool.occupied} in use without a lease"
    head += f" · {pool.unhealthy} out of service"
    if pool.silent:
        head += f" ({pool.silent} not reporting)"
    head += f" · {pool.queued} queued"
    if pool.stranded:
        head += f" · {pool.stranded} free but stranded (no waiting request fits on their node)"
    models = [
        f"• {escape(m.model)}: {m.free} free, {m.leased} leased, "
        + (f"{m.occupied} in use without a lease, " if m.occupied else "")
        + f"{m.unhealthy} out of service"
        for m in pool.models[:20]
    ]
    return "\n".join([head, *models])


def status_message(pools: Sequence[PoolStatus]) -> Message:
    blocks = [header("GPU pools")]
    blocks += listing(pools, lambda p: [section(pool_text(p))], 45, "pool")
    if not pools:
        blocks.append(section("No pools are configured."))
    blocks.append(context("Out of service means unhealthy, not reporting, or drained."))
    text = "; ".join(f"{p.name}: {p.free} free of {p.size}" for p in pools) or "No pools."
    return message(escape(text), blocks)


#: GPUs named in one of status's admin sections; the rest are counted, not listed.
SHOWN_GPUS = 20


def named_gpus(title: str, found: Sequence[str]) -> Block:
    """A section of status for admins: the first GPUs of `found` by name, and how many more."""
    lines = "\n".join(f"• `{escape(line)}`" for line in found[:SHOWN_GPUS])
    if len(found) > SHOWN_GPUS:
        lines += f"\n…and {len(found) - SHOWN_GPUS} more"
    return section(f"{title}:\n{lines}")


def quota_message(quotas: Sequence[QuotaUse], team: str | None = None) -> Message:
    title = f"Quota of team {team}" if team else "Quota"
    teams = {q.team for q in quotas}

    def row(quota: QuotaUse) -> list[Block]:
        who = f"{escape(quota.team)} in " if len(teams) > 1 else ""
        text = f"{who}*{escape(quota.pool)}*: {quota_line(quota)}"
        if quota.fair_share is not None:
            text += f"\n{fair_share_line(quota.fair_share)}"
        return [section(text)]

    blocks = [header(title), *listing(quotas, row, 45, "pool")]
    if not quotas:
        blocks.append(section(f"{escape(team or 'This team')} has no quota in any pool."))
    blocks.append(context(QUOTA_LEGEND))
    if any(q.fair_share is not None for q in quotas):
        blocks.append(context(FAIR_SHARE_LEGEND))
    text = "; ".join(f"{q.pool}: {q.used} of {q.nominal} in use" for q in quotas)
    return message(escape(f"{title}: {text or 'none'}"), blocks)


def queue_message(entries: Sequence[QueueEntry]) -> Message:
    """Queued requests pool by pool, in the order they will be served, each with its reasons."""
    blocks = [header("Queue")]
    blocks += listing(entries, lambda e: [section(queue_text(e))], 45, "request")
    if not entries:
        blocks.append(section("Nothing is queued: every request has been served."))
    else:
        blocks.append(context(queue_legend(entries[0].backfill)))
    return message(f"{plural(len(entries), 'request')} queued.", blocks)


QUEUE_ORDER = (
    "Each team's requests wait in their own queue per pool (inside nominal, then priority, then "
    "arrival). The teams' first requests are served inside nominal quota first, then the team "
    "that used least of its fair share lately, then priority, then arrival. "
)
BACKFILL = {
    "reserve": "A request further back starts first only if it delays no earlier request's "
    "expected start. ",
    "best_effort": "A request further back starts first whenever it fits. ",
    "none": "Nobody starts before a request ahead of them. ",
}
GUARANTEE = (
    "A request inside nominal recalls borrowed GPUs; the cooldown never holds it up beyond "
    "recall.max_guarantee_wait."
)


def queue_legend(backfill: str) -> str:
    """How the queue is served, as the pool's `queue.backfill` says."""
    return QUEUE_ORDER + BACKFILL.get(backfill, BACKFILL["reserve"]) + GUARANTEE


def queue_text(entry: QueueEntry) -> str:
    """One waiting request in plain words: where it stands, when it may start and what it
    waits for."""
    request = entry.request
    pool, team = escape(request.pool), escape(request.team)
    lines = [f"*{entry.position}.* {request_text(request, who=True)}"]
    if entry.head:
        lines.append(f"Behind {entry.head} in team {team}'s queue for {pool}.")
    else:
        free = plural(entry.free, "GPU")
        lines.append(f"First of team {team}'s requests in the {pool} queue; {free} free now.")
    if entry.expected_start is not None:
        lines.append(
            f"Expected to start {slack_date(entry.expected_start)}, when enough leases end "
            "(sooner if GPUs are released)."
        )
    elif entry.for_gpus:
        lines.append("No start can be foreseen yet.")
    if entry.waits_for:
        lines.append(f"Why it waits: {clip(escape(entry.waits_for), 300)}")
    if entry.share is not None:
        line = fair_share_line(entry.share)
        lines.append(f"Team {team}'s {line[0].lower()}{line[1:]}.")
    lines += recall_lines(entry)
    lines.append(f"Withdrawn {slack_date(entry.withdrawn_at)} if still waiting.")
    return "\n".join(lines)


def recall_lines(entry: QueueEntry) -> list[str]:
    """The leases being recalled for a waiting request, and when: borrowed ones for a request
    inside its team's nominal, lower-priority ones of its own team for a higher-priority one."""
    lending = [r for r in entry.recalls if not r.within_team]
    own = [r for r in entry.recalls if r.within_team]
    lines = _guarantee_lines(entry, lending) if entry.guaranteed else []
    if own:
        team = escape(entry.request.team)
        shown = "; ".join(_recall_text(r) for r in own[:6])
        lines.append(f"Lower-priority leases of its own team {team} are preempted for it: {shown}")
    if entry.passed_within:
        lines.append(
            "Lower-priority leases of its own team that cannot be preempted for it now: "
            + passed_over_text(entry.passed_within)
        )
    return lines


def _guarantee_lines(entry: QueueEntry, recalls: Sequence[Recall]) -> list[str]:
    if not recalls:
        if entry.passed_over:
            return [
                "It is inside its team's nominal quota, but no borrowed lease can be recalled "
                "for it now: " + passed_over_text(entry.passed_over)
            ]
        return ["It is inside its team's nominal quota; nothing borrowed can be recalled yet."]
    shown = "; ".join(_recall_text(r) for r in recalls[:6])
    lines = ["Inside its team's nominal quota, so borrowed GPUs are recalled: " + shown]
    if entry.passed_over:
        lines.append("Passed over: " + passed_over_text(entry.passed_over))
    return lines


def _recall_text(recall: Recall) -> str:
    lease = recall.lease
    when = (
        f"taken {slack_date(recall.taken_at)}"
        if recall.taken_at
        else "warned now, taken after the notice"
    )
    return (
        f"L{lease.lease} ({mention(lease.holder)}, {plural(lease.gpus, 'GPU')}, "
        f"team {escape(lease.team)}): {when}"
    )


def passed_over_text(passed: Sequence[PassedOver], most: int = 3) -> str:
    """The borrowed leases recall may not take, each with why; the first `most` of them."""
    shown = [
        f"L{p.lease.lease} ({mention(p.lease.holder)}, {plural(p.lease.gpus, 'GPU')}, "
        f"team {escape(p.lease.team)}): {clip(escape(p.why), 120)}"
        for p in passed[:most]
    ]
    if len(passed) > most:
        shown.append(f"and {plural(len(passed) - most, 'more lease')} passed over")
    return "; ".join(shown) + "."
