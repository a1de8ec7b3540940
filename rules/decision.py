"""What a decision is: the rules that matched, the one that decided, and what applies.

The engines produce it (rules.engine); the sweep and the request use cases act on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rules.domain import Outcome, Subject
from rules.policy import Verdict


@dataclass(frozen=True)
class Match:
    rule: str
    verdict: Verdict
    because: str
    observe: bool = False


@dataclass(frozen=True)
class Decision:
    subject: Subject
    revision: str
    engine: str
    facts: Mapping[str, Any]
    matches: tuple[Match, ...]
    deciding: str  # the deciding rule id, or "default"
    verdict: Verdict | None  # requests: the outcome that applies
    actions: tuple[Match, ...] = ()  # sweeps: each enforced action once
    because: str = ""

    @property
    def matching(self) -> list[str]:
        return [m.rule for m in self.matches]

    def once_approved(self) -> Outcome:
        """The outcome once a person has said yes: `ask` is answered, while a `deny` or a
        `queue` that also matched still holds (a borrow beyond what lenders have waits)."""
        left = [
            m.verdict.outcome
            for m in self.matches
            if not m.observe and m.verdict.outcome not in (None, Outcome.ASK)
        ]
        return max(left, key=lambda o: o.severity, default=Outcome.APPROVE)

    @property
    def would_have(self) -> tuple[Match, ...]:
        """Matches of rules in observe mode: recorded, never acted on."""
        return tuple(m for m in self.matches if m.observe)

    def for_action(self, action: Match) -> Decision:
        """One sweep action as a decision of its own: the rule that asked for it decides, its
        reason explains it, and the matching rules are those that asked for the same action.

        A sweep evaluation may warn of expiry and of idleness at once; each is audited with the
        rule that asked for it, not with whichever rule happened to come first."""
        key = (action.verdict.action, action.verdict.reason)
        same = tuple(m for m in self.matches if (m.verdict.action, m.verdict.reason) == key)
        return replace(
            self,
            matches=same or (action,),
            deciding=action.rule,
            actions=() if action.observe else (action,),
            because=action.because,
        )
