"""Who is asked to approve a request, where the card goes, and who may settle it.

Also what no rule needs to weigh before a borrow is decided: a person in no team, a pool that
does not exist, an impossible count or duration, a reason too long to read; and, for the borrow
form, the hard limits each field is checked against before anything is filed. Pure: the
services load and write.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta

from rules.domain import format_duration, plural
from rules.policy import Approvals, Policy, Team

#: The longest reason a borrow or extension may give; cards show at most `SHOWN_REASON` of it.
MAX_REASON = 500
SHOWN_REASON = 200


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
    policy: Policy,
    user: str,
    *,
    pool: str,
    gpus: int,
    duration: timedelta | None,
    reason: str = "",
) -> Refusal | None:
    """What no rule needs to weigh: unknown pools, impossible counts, people in no team, a
    reason longer than `MAX_REASON`."""
    if policy.team_of(user) is None:
        return Refusal(
            f"<@{user}> is not a member of any team in the rule files, so there is no quota "
            "to borrow from. Ask an admin to add you to a team.",
            code="no-team",
        )
    if len(reason.strip()) > MAX_REASON:
        return Refusal(reason_too_long(reason), "long-reason")
    if pool not in policy.pools:
        pools = ", ".join(sorted(policy.pools))
        return Refusal(f"There is no pool called `{pool}`. Pools: {pools}.", "no-pool")
    if gpus < 1:
        return Refusal("Ask for at least one GPU, e.g. `2 a100 for 6h`.", "bad-count")
    if duration is not None and duration <= timedelta(0):
        return Refusal("The duration must be positive, e.g. `for 6h`.", "bad-duration")
    return None


def may_settle(
    user: str,
    *,
    request_id: int | None,
    requester: str,
    approvers: Collection[str],
    team: Team | None = None,
    admins: Collection[str] = (),
) -> str | None:
    """Why `user` may not approve or deny a request (None: they may), in words that say what
    they are not and who may. Nobody settles their own request; only the people it was routed
    (or escalated) to settle it. `team`: the requester's team, when it is still in the rule
    files; `admins`: the gpubot admins, told apart from the people it was escalated to."""
    if user == requester:
        return "Nobody approves or denies their own request; a manager or an admin will."
    if user in approvers:
        return None
    head = f"You may not approve or deny R{request_id}"
    if team is None:
        return f"{head}: only its team's managers and the gpubot admins can."
    if user in team.managers:
        return (
            f"{head}: it was sent to the gpubot admins, so even a manager of {team.name} "
            "cannot approve this."
        )
    return (
        f"{head}: you are not a manager of {team.name}, so you cannot approve this. "
        f"Only {_who_may(team, approvers, admins)} can."
    )


def _who_may(team: Team, approvers: Collection[str], admins: Collection[str]) -> str:
    """The people who may settle a request, as a refusal names them: the team's managers, the
    admins, and anyone else it was escalated to."""
    others = [f"<@{a}>" for a in approvers if a not in team.managers and a not in admins]
    named = [f"{team.name}'s managers", "the gpubot admins", *others]
    return ", ".join(named[:-1]) + " and " + named[-1]


def reason_too_long(reason: str) -> str:
    return (
        f"Please keep the reason to {MAX_REASON} characters (yours has "
        f"{len(reason.strip())}): your manager reads it on a card. Say the gist; a link "
        "can carry the rest."
    )


def pools_for(policy: Policy, team: Team | None) -> list[str]:
    """The pools a team may borrow from: those where it has a quota to use, sorted."""
    if team is None:
        return []
    return sorted(
        name
        for name, pool in policy.pools.items()
        if (quota := pool.quotas.get(team.name)) is not None
        and quota.nominal + quota.borrowing_limit > 0
    )


def most_gpus(policy: Policy, team: str, pool: str) -> int:
    """The most GPUs one request of `team` could ever be granted in `pool`: the pool's
    `max_gpus_per_request`, the team's `nominal + borrowing_limit` and the pool's size."""
    found = policy.pools[pool]
    quota = found.quotas.get(team)
    limit = quota.nominal + quota.borrowing_limit if quota is not None else 0
    return min(found.limits.max_gpus_per_request, limit, found.size)


def check_form(
    policy: Policy,
    user: str,
    *,
    pool: str,
    gpus: int | None,
    duration: timedelta | None,
    reason: str,
) -> dict[str, str]:
    """The borrow form's problems by field ("pool", "count", "duration", "reason"), checked
    against the hard limits before anything is filed; `gpus` None: already answered."""
    team = policy.team_of(user)
    problems: dict[str, str] = {}
    allowed = pools_for(policy, team)
    if team is None:
        problems["pool"] = "You are in no team, so there is no quota to borrow from. Ask an admin."
    elif pool not in allowed:
        shown = ", ".join(allowed) or "none"
        problems["pool"] = f"Team {team.name} has no quota in {pool}. Its pools: {shown}."
    elif gpus is not None:
        problems |= _count_problem(policy, team.name, pool, gpus)
    if pool in policy.pools and duration is not None:
        longest = policy.pools[pool].limits.max_duration
        if duration <= timedelta(0):
            problems["duration"] = "Ask for some time to come: 6h, or an end still ahead."
        elif duration > longest:
            problems["duration"] = (
                f"A borrow in {pool} lasts at most {format_duration(longest)}; ask for less."
            )
    if not reason.strip():
        problems["reason"] = "Say in a few words what the GPUs are for: your manager may read it."
    elif len(reason.strip()) > MAX_REASON:
        problems["reason"] = f"At most {MAX_REASON} characters, please (yours has {len(reason)})."
    return problems


def _count_problem(policy: Policy, team: str, pool: str, gpus: int) -> dict[str, str]:
    most = most_gpus(policy, team, pool)
    if gpus < 1:
        return {"count": "Ask for at least one GPU."}
    if gpus > most:
        most_text = plural(most, "GPU")
        return {"count": f"One request of team {team} in {pool} may take at most {most_text}."}
    return {}


def escalation_targets(policy: Policy, settings: Approvals) -> list[str]:
    """Who an escalation goes to: `admins` read as the admins' ids; people and channels as
    they are, in the order written, each once."""
    out: list[str] = []
    for target in settings.escalate_to:
        for one in sorted(policy.admins) if target == "admins" else [target]:
            if one not in out:
                out.append(one)
    return out


def escalation_settlers(policy: Policy, targets: Collection[str]) -> list[str]:
    """Who may settle a request once it is escalated to `targets`: the people among them, and
    the admins when a channel is among them (the bot cannot tell who reads a channel, so from
    a channel's card the admins settle)."""
    people = [t for t in targets if t[:1] in ("U", "W")]
    if any(t[:1] in ("C", "G") for t in targets):
        people += [a for a in sorted(policy.admins) if a not in people]
    return people
