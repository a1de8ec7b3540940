"""Who is asked to approve a request, where the card goes, and who may settle it.

Also what no rule needs to weigh before a borrow is decided: a person in no team, a pool that
does not exist, an impossible count or duration. Pure: the services load and write.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta

from rules.policy import Approvals, Policy


@dataclass(frozen=True)
class Refusal:
    """Why nothing was done, in words for the person, and a short machine-readable code."""

    message: str
    code: str


def approvers_for(policy: Policy, team: str, who: str) -> list[str]:
    """The people asked, in order: the team's managers when `who` is "managers", then every
    admin who is not one of them."""
    managers = sorted(policy.teams[team].managers) if who == "managers" else []
    return managers + sorted(a for a in policy.admins if a not in managers)


def route_for(policy: Policy, team: str, who: str) -> str:
    """Where the approval card goes: the team's approval channel when its managers are asked
    and it has one, else "managers" (by DM) or "admins"."""
    channel = policy.teams[team].approval_channel
    if who != "managers":
        return "admins"
    return channel or "managers"


def check_ask(
    policy: Policy, user: str, *, pool: str, gpus: int, duration: timedelta | None
) -> Refusal | None:
    """What no rule needs to weigh: unknown pools, impossible counts, people in no team."""
    if policy.team_of(user) is None:
        return Refusal(
            f"<@{user}> is not a member of any team in the rule files, so there is no quota "
            "to borrow from. Ask an admin to add you to a team.",
            code="no-team",
        )
    if pool not in policy.pools:
        pools = ", ".join(sorted(policy.pools))
        return Refusal(f"There is no pool called `{pool}`. Pools: {pools}.", "no-pool")
    if gpus < 1:
        return Refusal("Ask for at least one GPU, e.g. `2 a100 for 6h`.", "bad-count")
    if duration is not None and duration <= timedelta(0):
        return Refusal("The duration must be positive, e.g. `for 6h`.", "bad-duration")
    return None


def may_settle(
    user: str, *, request_id: int | None, requester: str, approvers: Collection[str]
) -> str | None:
    """Why `user` may not approve or deny a request (None: they may). Nobody settles their
    own request; only the people it was routed to settle it."""
    if user == requester:
        return "Nobody approves or denies their own request; a manager or an admin will."
    if user not in approvers:
        return (
            f"You may not approve or deny R{request_id}: only its team's managers "
            "and the gpubot admins can."
        )
    return None


def escalation_targets(policy: Policy, settings: Approvals) -> list[str]:
    """Who an escalation goes to: `admins` read as the admins' ids; people and channels as
    they are, in the order written, each once."""
    out: list[str] = []
    for target in settings.escalate_to:
        for one in sorted(policy.admins) if target == "admins" else [target]:
            if one not in out:
                out.append(one)
    return out
