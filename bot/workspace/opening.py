"""The demo's opening state: the fleet starts with people's work already on GPUs, so each of them
borrows what they run (through the real use cases, so the audit log tells it) before time starts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from bot.services import BorrowAsk, Services
from bot.services.results import BorrowResult, Refused
from bot.telemetry.fleet_file import FleetNode, Segment
from rules.domain import Outcome
from rules.policy import Policy

REASON = "work already running when the demo started"
_START = timedelta(0)
_HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Holding:
    """One person's work on one node at the start of the replay: the lease it deserves."""

    user: str  # Slack user id
    pool: str
    gpus: tuple[tuple[str, int], ...]
    duration: timedelta


def holdings(nodes: Mapping[str, FleetNode], policy: Policy) -> list[Holding]:
    """Who runs what at the start, one holding per person per node. Work that starts later
    stays unleased: that is the fleet's unreserved use, the exception the demo shows."""
    found: dict[tuple[str, str, str], list[tuple[int, timedelta | None]]] = defaultdict(list)
    for node, spec in sorted(nodes.items()):
        pool = next((p.name for p in policy.pools.values() if node in p.nodes), None)
        if pool is None:
            continue
        for index in range(spec.gpus):
            segment = spec.segment(index, _START)
            running = segment.processes if segment else ()
            accounts = {p.user for p in running if p.user and p.leased}
            for account in sorted(accounts):
                user = policy.accounts.get(account)
                if user is not None:
                    ends = _ends(spec.timelines.get(index, ()), account)
                    found[(user, pool, node)].append((index, ends))
    return [
        Holding(user, pool, tuple((node, i) for i, _ in gpus), _duration(policy, pool, gpus))
        for (user, pool, node), gpus in sorted(found.items())
    ]


def _ends(timeline: Sequence[Segment], account: str) -> timedelta | None:
    """When `account`'s processes leave the GPU; None: they run to the end of the replay."""
    for segment in timeline:
        if segment.start > _START and account not in {p.user for p in segment.processes}:
            return segment.start
    return None


def _duration(policy: Policy, pool: str, gpus: list[tuple[int, timedelta | None]]) -> timedelta:
    """The work's end rounded up to the hour, plus an hour. Work that never ends takes the
    pool's default (a protected pool's, such as serving, its longest). Never beyond the limit."""
    spec = policy.pools[pool]
    limits = spec.limits
    ends = [end for _, end in gpus]
    if any(end is None for end in ends):
        wanted = limits.max_duration if spec.protected else limits.default_duration
    else:
        last = max(end for end in ends if end is not None)
        wanted = _HOUR * (math.ceil(last / _HOUR) + 1)
    return min(wanted, limits.max_duration)


def seed(services: Services, nodes: Mapping[str, FleetNode]) -> list[str]:
    """Borrow every holding as its person; what the rules ask about, the first approver
    settles. Returns one line per holding, for the log."""
    told = []
    for holding in holdings(nodes, services.policy):
        ask = BorrowAsk(
            holding.pool, len(holding.gpus), holding.duration, reason=REASON, prefer=holding.gpus
        )
        result = services.borrow(holding.user, ask)
        told.append(f"{holding.user} {holding.pool} {holding.gpus}: {_settle(services, result)}")
    return told


def _settle(services: Services, result: BorrowResult | Refused) -> str:
    if isinstance(result, Refused):
        return f"refused: {result.message}"
    if result.outcome != Outcome.ASK:
        return str(result.outcome)
    request = result.request
    approver = next((a for a in request.approvers if a != request.requester), None)
    if approver is None:
        return "asked, nobody to approve"
    settled = services.approve(approver, request.id, reason="the work was already running")
    return f"asked, {approver}: {'refused' if isinstance(settled, Refused) else 'approved'}"
