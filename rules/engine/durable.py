"""The only module that imports durable-rules (2.0.28); nothing outside it sees a durable type.

durable's C core has sharp edges (it crashes or leaks when used naively), so this wrapper:
- gives each compiled policy revision its own Host with the timer threads disabled;
- compiles every rule to a single-fact condition (joins crash the C core) plus a
  lowest-priority catch-all, so every evaluation runs at least one action (deleting a session
  in which no action ran frees an uninitialised pointer);
- evaluates each fact in a fresh session id that is deleted afterwards (1024 live sessions cap);
- records only which rule fired (no I/O, no Python inside an action), raises engine errors;
- frees the C rulesets on close, after in-flight evaluations finish (durable never does).
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import itertools
import json
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import durable_rules_engine
    from durable.engine import Host

from rules import expr
from rules.domain import Subject
from rules.engine import RevisionRetiredError
from rules.errors import PolicyError, PolicyEvaluationError, Problem
from rules.policy import Policy

_CATCH_ALL = "__catch_all__"
# One encoder for every message (json.dumps with options builds a new one per call).
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_CATCH_ALL_PRI = 65535  # durable's pri is an unsigned short; lower fires first
_MAX_LEAKED = 256  # sessions left undeleted after an engine failure; the cap is 1024


class _SyncHost(Host):  # type: ignore[misc]
    """A Host without the two self-rescheduling timer threads (no timers, no async actions)."""

    def _run(self) -> None:
        pass


def _tune_malloc() -> None:
    """Stop glibc trimming the heap top on every session (a measured 4-5x slowdown)."""
    name = ctypes.util.find_library("c")
    if not name or "libc.so" not in name:
        return
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD


_tune_malloc()


class DurableEngine:
    """One compiled policy revision on its own private durable Host.

    Evaluation drives the ruleset's C handle directly (assert the fact, then start and complete
    each queued action, reading only the fired rule's name), the same calls Host.assert_fact
    makes, without Host's per-action Closure, JSON round trips and state rewrites: that is what
    keeps one decision at about a third of the time. No Python code runs inside an action, so
    nothing can do I/O there and no error can be swallowed there.
    """

    name = "durable"

    def __init__(self, policy: Policy) -> None:
        self.revision = policy.revision
        self.leaked_sessions = 0
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._host = _SyncHost()
        self._handles: dict[Subject, int] = {}
        definitions: dict[str, dict[str, Any]] = {}
        for subject in Subject:
            rules: dict[str, Any] = {}
            for i, rule in enumerate(policy.rules_for(subject)):
                rules[f"r{i}"] = {
                    "pri": min(i, _CATCH_ALL_PRI - 1),
                    "all": [{"m": expr.compile_durable(rule.condition)}],
                    "run": _never_called,
                }
            rules[_CATCH_ALL] = {
                "pri": _CATCH_ALL_PRI,
                "all": [{"m": {expr.ALWAYS: 1}}],
                "run": _never_called,
            }
            definitions[subject.value] = rules
        try:
            self._host.set_rulesets(copy.deepcopy(definitions))
        except Exception as exc:  # durable_rules_engine.error carries only "error code: NNN"
            raise PolicyError(
                [Problem("(policy)", 1, 1, f"the engine rejected it: {exc}")]
            ) from exc
        for subject in Subject:
            self._handles[subject] = self._host.get_ruleset(subject.value)._handle
        # The message carries only the facts some condition reads: the compiled rules cannot
        # see any other, and a smaller message is cheaper to encode and for durable to parse.
        self._keys: dict[Subject, tuple[tuple[str, str], ...]] = {
            subject: tuple(
                (name, expr.durable_key(name))
                for name in sorted(
                    set().union(*(expr.facts_used(r.condition) for r in policy.rules_for(subject)))
                )
            )
            for subject in Subject
        }

    def match(self, subject: Subject, facts: Mapping[str, Any]) -> Sequence[int]:
        try:
            message = {key: facts[name] for name, key in self._keys[subject]}
        except KeyError:  # a fact is missing: durable never matches a missing field either
            message = {key: facts[name] for name, key in self._keys[subject] if name in facts}
        with self._lock:
            handle = self._handles.get(subject, 0)
            if not handle:
                raise RevisionRetiredError(self.revision)
            sid = f"e{next(self._ids)}"
            message["sid"] = sid
            message["id"] = sid
            message[expr.ALWAYS] = 1
            fired: list[int] = []
            ran = 0
            try:
                code, state = durable_rules_engine.assert_fact(handle, _encode(message))
                if code != 0:  # 1: nothing matched, 2: already observed; the catch-all forbids both
                    raise PolicyEvaluationError(f"durable answered code {code} to a fresh fact")
                started = durable_rules_engine.start_action_for_state(handle, state)
                action = started[1] if started else None
                while action:
                    ran += 1
                    # The action arrives as {"<rule name>":{...}}: only its name is needed.
                    name = action[2 : action.index('"', 2)]
                    # An `$or` whose branches both hold fires its rule once per branch.
                    if name != _CATCH_ALL and int(name[1:]) not in fired:
                        fired.append(int(name[1:]))
                    action = durable_rules_engine.complete_and_start_action(handle, state)
            except durable_rules_engine.error as exc:  # e.g. error code 303 on huge rulesets
                raise PolicyEvaluationError(f"durable failed: {exc}") from exc
            finally:
                if ran:
                    durable_rules_engine.delete_state(handle, sid)
                else:  # no action ran: deleting this session would crash the process
                    self.leaked_sessions += 1
        if self.leaked_sessions > _MAX_LEAKED:
            raise PolicyEvaluationError("too many sessions left behind; reload the rules")
        return fired

    def close(self) -> None:
        """Free the C rulesets; waits for an evaluation in flight, refuses later ones."""
        with self._lock:
            for subject, handle in list(self._handles.items()):
                if handle:
                    durable_rules_engine.delete_ruleset(handle)
                    self._host.get_ruleset(subject.value)._handle = 0
                self._handles[subject] = 0

    @property
    def closed(self) -> bool:
        return not any(self._handles.values())


def _never_called(c: Any) -> None:
    """Host requires a callable per rule; DurableEngine.match completes actions itself."""
    raise AssertionError("durable actions are completed by DurableEngine.match")
