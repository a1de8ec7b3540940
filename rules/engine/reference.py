"""The pure-Python reference evaluator: walks the parsed condition trees of a policy.

It is the differential oracle for the durable engine and the fallback where durable cannot be
imported; every decision records which of the two produced it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rules import expr
from rules.domain import Subject
from rules.policy import Policy


class ReferenceEngine:
    name = "reference"

    def __init__(self, policy: Policy) -> None:
        self._conditions = {
            subject: tuple(r.condition for r in policy.rules_for(subject)) for subject in Subject
        }

    def match(self, subject: Subject, facts: Mapping[str, Any]) -> Sequence[int]:
        return [i for i, cond in enumerate(self._conditions[subject]) if expr.evaluate(cond, facts)]

    def close(self) -> None:
        """Nothing to free: the trees belong to the policy."""
