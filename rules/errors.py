"""The errors of the decision core, drawn as one tree:

RulesError
├── PolicyError            rule files that cannot be loaded: a list of located Problems
├── FactError              facts handed to an engine that do not match the catalogue (a bug)
└── PolicyEvaluationError  the engine failed while evaluating (broken infrastructure)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong in one rule file, at 1-based line and column."""

    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


class RulesError(Exception):
    """Base of every error raised by rules/."""


class PolicyError(RulesError):
    """The rule files cannot become a policy; `problems` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(set(problems))
        super().__init__("\n".join(str(p) for p in self.problems))


class FactError(RulesError):
    """Facts given to an engine are missing a name or carry the wrong type."""


class PolicyEvaluationError(RulesError):
    """The engine failed while evaluating facts."""
