"""Parsing and type checking of the `when` language: text in, a tree of rules.expr out, every
fact name checked against the catalogue. Never `eval`.

    expr  := or
    or    := and ("or" and)*
    and   := not ("and" not)*
    not   := "not" not | cmp
    cmp   := atom (("==" | "!=" | "<" | "<=" | ">" | ">=") atom | ["not"] "in" list)?
    atom  := number | duration | string | true | false | fact.name | "(" expr ")"
    list  := "[" literal ("," literal)* [","] "]"

An error is an ExprError carrying the 0-based offset of what it is about.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from rules.catalogue import FactSpec, FactType
from rules.expr import (
    BoolOp,
    Compare,
    ExprError,
    Fact,
    In,
    Literal,
    Node,
    Not,
    Truth,
    Value,
    parse_duration,
)

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<duration>(?:\d+(?:\.\d+)?[smhdw])+(?![\w.]))
  | (?P<number>-?\d+(?:\.\d+)?(?![\w.]))
  | (?P<string>'[^'\\]*'|"[^"\\]*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<op>==|!=|<=|>=|<|>|=)
  | (?P<punct>[()\[\],])
    """,
    re.VERBOSE,
)
_ORDERED = {FactType.NUMBER, FactType.DURATION}


def parse(text: str, facts: Mapping[str, FactSpec]) -> Node:
    """Parse and type-check `text` against the catalogue; raise ExprError with an offset."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("a condition is required, e.g. `request.gpus > 4`", 0)
    return _Parser(text, facts).parse()


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    offset: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExprError(f"unexpected character {text[pos]!r}", pos)
        kind = m.lastgroup or ""
        if kind == "op" and m.group() == "=":
            raise ExprError("use == to compare, not =", pos)
        if kind != "ws":
            word = m.group()
            if kind == "punct" or (
                kind == "name" and word in ("and", "or", "not", "in", "true", "false")
            ):
                kind = word
            out.append(_Tok(kind, word, pos))
        pos = m.end()
    out.append(_Tok("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str, facts: Mapping[str, FactSpec]) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.facts = facts

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self, kind: str) -> _Tok:
        tok = self.tok
        if tok.kind != kind:
            raise ExprError(f"expected {_describe(kind)}, found {_found(tok)}", tok.offset)
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.or_()
        if self.tok.kind != "end":
            raise ExprError(
                f"expected `and`, `or` or the end, found {_found(self.tok)}", self.tok.offset
            )
        return node

    def or_(self) -> Node:
        parts = [self.and_()]
        while self.tok.kind == "or":
            self.i += 1
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else BoolOp("or", tuple(parts))

    def and_(self) -> Node:
        parts = [self.not_()]
        while self.tok.kind == "and":
            self.i += 1
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else BoolOp("and", tuple(parts))

    def not_(self) -> Node:
        if self.tok.kind == "not":
            self.i += 1
            return Not(self.not_())
        return self.cmp()

    def cmp(self) -> Node:
        start = self.tok
        if start.kind == "(":
            self.i += 1
            inner = self.or_()
            self.take(")")
            return inner
        left = self.atom()
        tok = self.tok
        if tok.kind == "op":
            self.i += 1
            right = self.atom()
            return _check_compare(tok, left, right, start.offset)
        if tok.kind == "in" or (tok.kind == "not" and self.toks[self.i + 1].kind == "in"):
            negated = tok.kind == "not"
            self.i += 2 if negated else 1
            return self.in_list(left, negated, start.offset)
        if left.type != FactType.BOOLEAN:
            what = f"`{left.name}` is a {left.type}" if isinstance(left, Fact) else "a constant"
            raise ExprError(
                f"{what}, not a condition: compare it, e.g. `{_example(left)}`", start.offset
            )
        return Truth(left)

    def in_list(self, left: Fact | Literal, negated: bool, offset: int) -> Node:
        if not isinstance(left, Fact):
            raise ExprError("`in` needs a fact on its left", offset)
        if left.type not in (FactType.STRING, FactType.NUMBER, FactType.DURATION):
            raise ExprError(f"`in` does not apply to the {left.type} `{left.name}`", offset)
        self.take("[")
        values: list[Value] = []
        offsets: list[int] = []
        while True:
            item_tok = self.tok
            item = self.atom()
            if not isinstance(item, Literal):
                raise ExprError("a list holds constants only", item_tok.offset)
            if item.type != left.type:
                raise ExprError(
                    f"`{left.name}` is a {left.type}, but this is a {item.type}", item_tok.offset
                )
            values.append(item.value)
            offsets.append(item_tok.offset)
            if self.tok.kind == ",":
                self.i += 1
                if self.tok.kind == "]":
                    break
                continue
            break
        self.take("]")
        return In(left, tuple(values), negated, tuple(offsets))

    def atom(self) -> Fact | Literal:
        tok = self.tok
        self.i += 1
        if tok.kind == "number":
            number = float(tok.text)
            value = int(number) if number.is_integer() else number
            return Literal(value, FactType.NUMBER, tok.offset)
        if tok.kind == "duration":
            minutes = parse_duration(tok.text) or 0.0
            value = int(minutes) if minutes.is_integer() else minutes
            return Literal(value, FactType.DURATION, tok.offset)
        if tok.kind == "string":
            return Literal(tok.text[1:-1], FactType.STRING, tok.offset)
        if tok.kind in ("true", "false"):
            return Literal(tok.kind == "true", FactType.BOOLEAN, tok.offset)
        if tok.kind == "name":
            spec = self.facts.get(tok.text)
            if spec is None:
                raise ExprError(unknown_fact(tok.text, self.facts), tok.offset)
            return Fact(spec.name, spec.type)
        self.i -= 1
        raise ExprError(f"expected a fact name or a constant, found {_found(tok)}", tok.offset)


def _check_compare(op: _Tok, left: Fact | Literal, right: Fact | Literal, offset: int) -> Compare:
    if isinstance(left, Literal) and isinstance(right, Literal):
        raise ExprError("this compares two constants; one side must be a fact", offset)
    if left.type != right.type:
        fact = left if isinstance(left, Fact) else right
        other = right if fact is left else left
        hint = ""
        if FactType.DURATION in (left.type, right.type) and FactType.NUMBER in (
            left.type,
            right.type,
        ):
            hint = " (write durations with a unit: 90m, 6h, 2d)"
        raise ExprError(
            f"`{fact.name}` is a {fact.type} but is compared with a {other.type}{hint}",  # type: ignore[union-attr]
            offset,
        )
    if op.text not in ("==", "!=") and left.type not in _ORDERED:
        raise ExprError(f"`{op.text}` does not apply to {left.type}s; use == or !=", op.offset)
    return Compare(op.text, left, right)


def _describe(kind: str) -> str:
    return {"end": "the end", "name": "a fact name"}.get(kind, f"`{kind}`")


def _found(tok: _Tok) -> str:
    return "the end of the condition" if tok.kind == "end" else f"`{tok.text}`"


def _example(node: Fact | Literal) -> str:
    if isinstance(node, Literal):
        return "request.gpus > 4"
    return {
        FactType.NUMBER: f"{node.name} > 0",
        FactType.DURATION: f"{node.name} >= 90m",
        FactType.STRING: f"{node.name} == 'a100'",
    }.get(node.type, node.name)


def unknown_fact(name: str, facts: Mapping[str, FactSpec]) -> str:
    prefix = name.split(".", maxsplit=1)[0] + "."
    close = sorted(n for n in facts if n.startswith(prefix))
    hint = f"; known {prefix}* facts: {', '.join(close)}" if close else ""
    return f"unknown fact `{name}`{hint}"
