"""The quota invariant, enforced in code whatever the rule files say: a team never holds more
than `nominal + borrowing_limit` in a pool, and borrowers never take more of the other teams'
unused nominal than their `lending_limit`s lend. Rule files may be stricter, never looser."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rules.decision import Decision, Match
from rules.domain import Outcome, RequestKind, Subject, plural
from rules.expr import facts_used
from rules.policy import Policy, Quota, Verdict

QUOTA_RULE = "quota-invariant"  # the id a decision names when the invariant decided it


@dataclass(frozen=True)
class Breach:
    """What a grant would break: `deny` past the team's limit, `queue` while lenders have too
    little (it may fit once they do)."""

    outcome: Outcome
    because: str


def exceeds(
    *, team: str, pool: str, quota: Quota, used: int, gpus: int, lendable: int
) -> Breach | None:
    """Whether granting `gpus` more to `team`, which holds `used` in `pool`, breaks its quota;
    `lendable`: what the other teams lend it now (`rules.facts.lendable`). An extension asks
    for 0 more GPUs: only a team already past its limit is refused one."""
    after = used + gpus
    limit = quota.nominal + quota.borrowing_limit
    if after > limit:
        return Breach(
            Outcome.DENY,
            f"team {team} would hold {plural(after, 'GPU')} in {pool}, above its limit of {limit} "
            f"(nominal {quota.nominal} + borrowing limit {quota.borrowing_limit})",
        )
    borrowed = max(0, after - quota.nominal)
    if gpus > 0 and borrowed > lendable:
        return Breach(
            Outcome.QUEUE,
            f"team {team} would borrow {plural(borrowed, 'GPU')} in {pool}, and "
            + (
                f"the other teams lend only {plural(lendable, 'GPU')} now within their lending "
                "limits"
                if lendable
                else "the other teams have no unused GPUs to lend now within their lending limits"
            ),
        )
    return None


def breach_of(facts: Mapping[str, Any]) -> Breach | None:
    """`exceeds` for a request's fact (see the catalogue for each name)."""
    borrow = facts["request.kind"] == RequestKind.BORROW.value
    gpus = int(facts["request.gpus"]) if borrow else 0
    quota = Quota(
        nominal=int(facts["team.nominal"]),
        borrowing_limit=int(facts["team.borrowing_limit"]),
        lending_limit=int(facts["team.lending_limit"]),
    )
    return exceeds(
        team=str(facts["user.team"]),
        pool=str(facts["request.pool"]),
        quota=quota,
        used=int(facts["team.used"]),
        gpus=gpus,
        lendable=int(facts["pool.lendable"]),
    )


def enforce(decision: Decision) -> Decision:
    """A request's decision with the invariant applied. A breach the rule files did not
    already answer as strictly is added as a match of its own, so it holds after an approval
    too; when it is stricter than the rules' outcome, it decides."""
    breach = breach_of(decision.facts)
    if breach is None or decision.verdict is None or decision.verdict.outcome is None:
        return decision
    covered = any(
        not m.observe
        and m.verdict.outcome not in (None, Outcome.ASK)
        and m.verdict.outcome.severity >= breach.outcome.severity
        for m in decision.matches
    )
    if covered:
        return decision
    match = Match(QUOTA_RULE, Verdict(outcome=breach.outcome), breach.because)
    decided = replace(decision, matches=(*decision.matches, match))
    if breach.outcome.severity <= decision.verdict.outcome.severity:
        return decided  # an `ask` still goes to a person; the approval then waits (queue)
    return replace(decided, deciding=QUOTA_RULE, verdict=match.verdict, because=breach.because)


# The facts through which request rules can state each limit; rule files that name none of a
# group leave that limit to the code alone, which `gpubot rules check` points out.
QUOTA_FACTS = {
    "the borrowing limit (nominal + borrowing_limit)": frozenset(
        {"team.limit", "team.borrowing_limit"}
    ),
    "the lending limits": frozenset({"pool.lendable", "team.lending_limit"}),
}


def unstated(policy: Policy) -> list[str]:
    """The limits no enforced request rule looks at, each with the facts that would state it."""
    seen: set[str] = set()
    for rule in policy.rules_for(Subject.REQUEST):
        if not rule.observe:
            seen |= facts_used(rule.condition)
    return [
        f"no request rule looks at {what} (`{'`, `'.join(sorted(names))}`); the code still "
        f"enforces it, and a request past it is decided by `{QUOTA_RULE}`"
        for what, names in QUOTA_FACTS.items()
        if not names & seen
    ]
