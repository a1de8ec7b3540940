"""The `when` language's tree: a whitelisted boolean expression over one flat fact, as
rules.expr_parser builds it from text. `evaluate` is the reference semantics and
`compile_durable` turns the same tree into a durable condition; `parse_duration` reads the
durations the language and the rule files share (90m, 6h, 2d, 1h30m).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rules.catalogue import FactType

Value = float | int | str | bool


class ExprError(ValueError):
    """A problem in an expression, at a 0-based character offset."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


# ---- the tree ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    name: str
    type: FactType


@dataclass(frozen=True)
class Literal:
    value: Value
    type: FactType
    offset: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Compare:
    op: str
    left: Fact | Literal
    right: Fact | Literal


@dataclass(frozen=True)
class In:
    fact: Fact
    values: tuple[Value, ...]
    negated: bool
    offsets: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    operands: tuple[Node, ...]


@dataclass(frozen=True)
class Truth:
    """A bare boolean: a boolean fact, or the literal true/false."""

    operand: Fact | Literal


Node = Compare | In | Not | BoolOp | Truth


# ---- durations --------------------------------------------------------------------------

_DURATION_RX = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_MINUTES = {"s": 1 / 60, "m": 1.0, "h": 60.0, "d": 24 * 60.0, "w": 7 * 24 * 60.0}


def parse_duration(text: str) -> float | None:
    """Minutes in a duration like 90m, 6h, 2d or 1h30m; None when `text` is not one."""
    if not _DURATION_RX.fullmatch(text.strip()):
        return None
    return sum(float(n) * _MINUTES[u] for n, u in _DURATION_PART.findall(text))


# ---- reading the tree ---------------------------------------------------------------------


def facts_used(node: Node) -> set[str]:
    """Every fact name the expression reads."""
    if isinstance(node, Compare):
        return {side.name for side in (node.left, node.right) if isinstance(side, Fact)}
    if isinstance(node, In):
        return {node.fact.name}
    if isinstance(node, Not):
        return facts_used(node.operand)
    if isinstance(node, BoolOp):
        return set().union(*(facts_used(o) for o in node.operands))
    return {node.operand.name} if isinstance(node.operand, Fact) else set()


def constants(node: Node) -> list[tuple[str, Value, int]]:
    """(fact name, constant, offset) for every constant a fact is compared with."""
    if isinstance(node, Compare):
        sides = (node.left, node.right)
        fact = next((s for s in sides if isinstance(s, Fact)), None)
        literal = next((s for s in sides if isinstance(s, Literal)), None)
        return [(fact.name, literal.value, literal.offset)] if fact and literal else []
    if isinstance(node, In):
        return [(node.fact.name, v, o) for v, o in zip(node.values, node.offsets, strict=True)]
    if isinstance(node, Not):
        return constants(node.operand)
    if isinstance(node, BoolOp):
        return [c for o in node.operands for c in constants(o)]
    return []


# ---- the reference semantics ------------------------------------------------------------


# ---- the reference semantics ------------------------------------------------------------


def _value(side: Fact | Literal, facts: Mapping[str, Any]) -> Any:
    return facts[side.name] if isinstance(side, Fact) else side.value


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def evaluate(node: Node, facts: Mapping[str, Any]) -> bool:
    """Evaluate the tree over complete, type-checked facts (see rules.engine.check_facts)."""
    if isinstance(node, Compare):
        return bool(_COMPARE[node.op](_value(node.left, facts), _value(node.right, facts)))
    if isinstance(node, In):
        return (facts[node.fact.name] in node.values) != node.negated
    if isinstance(node, Not):
        return not evaluate(node.operand, facts)
    if isinstance(node, BoolOp):
        if node.op == "and":
            return all(evaluate(o, facts) for o in node.operands)
        return any(evaluate(o, facts) for o in node.operands)
    return bool(_value(node.operand, facts))


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_DURABLE_OPS = {"<": "$lt", "<=": "$lte", ">": "$gt", ">=": "$gte", "!=": "$neq"}
ALWAYS = "_eval"  # a key every evaluated message carries with value 1


def durable_key(name: str) -> str:
    """Fact names become flat keys; durable would read a dotted key as a nested path."""
    return name.replace(".", "__")


def compile_durable(node: Node, negate: bool = False) -> dict[str, Any]:
    """The same tree as a durable-rules condition on one message.

    durable has no `not` and no `in`: negations are pushed down to the comparisons
    (exact here because every fact is always present) and `in` becomes a chain of `$or`.
    """
    if isinstance(node, Not):
        return compile_durable(node.operand, not negate)
    if isinstance(node, BoolOp):
        op = node.op if not negate else ("or" if node.op == "and" else "and")
        parts = [compile_durable(o, negate) for o in node.operands]
        return {"$and" if op == "and" else "$or": parts}
    if isinstance(node, In):
        negated = node.negated != negate
        key = durable_key(node.fact.name)
        if negated:
            return {"$and": [{"$neq": {key: v}} for v in node.values]}
        return {"$or": [{key: v} for v in node.values]}
    if isinstance(node, Truth):
        if isinstance(node.operand, Literal):
            return {ALWAYS: 1 if bool(node.operand.value) != negate else 0}
        return {durable_key(node.operand.name): not negate}
    left, right, op = node.left, node.right, node.op
    if isinstance(left, Literal):
        left, right, op = right, left, _FLIP[op]
    if negate:
        op = _NEGATE[op]
    assert isinstance(left, Fact)
    rhs: Any = {"$m": durable_key(right.name)} if isinstance(right, Fact) else right.value
    key = durable_key(left.name)
    if op == "==":
        return {key: rhs}
    return {_DURABLE_OPS[op]: {key: rhs}}
