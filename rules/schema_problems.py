"""A rule file that fails its schema (rules.schema), told as located problems: the key or value
at fault, with a message an admin can act on (the keys a section knows, what a Slack id looks
like) instead of pydantic's own words.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from rules.errors import Problem
from rules.schema import FleetSpec, LimitsSpec, PolicyFile, RecallSpec, WarningsSpec
from rules.yamlsrc import Located


def schema_problems(doc: Located, exc: ValidationError) -> list[Problem]:
    """One problem per pydantic error, placed at the deepest part of its path in the file."""
    out = []
    for err in exc.errors():
        path = tuple(
            p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-")
        )
        # pydantic appends the tried member of a union to the path; keep what exists in the file
        path = _existing_prefix(doc, path)
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = f"unknown key {str(path[-1])!r}" + _known_keys(path)
            out.append(doc.at(path, msg, key=True))
            continue
        if kind == "missing":
            msg = f"missing required key {str(err['loc'][-1])!r}"
        else:
            msg = _friendly(
                err["msg"], err.get("input"), str(err.get("ctx", {}).get("pattern", ""))
            )
        where = ".".join(str(p) for p in path) or "file"
        # A bad mapping key (an account name) is shown where the key is written.
        out.append(doc.at(path, f"{where}: {msg}", key=err["loc"][-1:] == ("[key]",)))
    return out


def _existing_prefix(doc: Located, path: tuple[Any, ...]) -> tuple[Any, ...]:
    best: tuple[Any, ...] = ()
    for i in range(len(path) + 1):
        if path[:i] in doc.values or path[:i] in doc.keys:
            best = path[:i]
    if len(best) < len(path) and path[: len(best) + 1] in doc.keys:
        best = path[: len(best) + 1]
    return best


def _known_keys(path: tuple[Any, ...]) -> str:
    models: dict[tuple[Any, ...], type[BaseModel]] = {
        (): PolicyFile,
        ("limits",): LimitsSpec,
        ("warnings",): WarningsSpec,
        ("recall",): RecallSpec,
        ("fleet",): FleetSpec,
    }
    known = models.get(path[:-1])
    if known is None:
        return ""
    return "; expected one of: " + ", ".join(known.model_fields.keys())


def _friendly(msg: str, value: Any, pattern: str) -> str:
    if msg.startswith("String should match pattern"):
        if pattern.startswith("^[UWB]"):
            return f"{value!r} is not a Slack user id (like U024BE7LH)"
        if pattern.startswith("^[CG]"):
            return f"{value!r} is not a Slack channel id (like C024BE91L)"
        return f"{value!r} is not a valid name (lowercase letters, digits, - and _)"
    if msg.startswith("Value error, "):
        return msg.removeprefix("Value error, ")
    return f"{msg} (got {value!r})" if value is not None else msg
