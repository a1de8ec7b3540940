"""One pass's decisions, each distinct combination of the facts the conditions read evaluated
once: at 100,000 GPUs a sweep decides 150,000 subjects, but their conditions read a handful of
facts whose values repeat (a busy GPU looks like every other busy GPU to the rules).

The memo keeps only which rules matched (and which shapes of facts passed the type check);
every decision is still assembled as `rules.engine.decide` assembles it, from the subject's own
facts, so its facts, reasons and rule ids are the subject's. A memo lives
for one pass and for one revision: a rules reload during the pass starts a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from rules import expr
from rules.catalogue import CATALOGUE
from rules.decision import Decision
from rules.domain import Subject
from rules.engine import (
    RevisionRetiredError,
    RuleEngine,
    _decision,  # where rules.engine.decide assembles every Decision
    check_facts,
)
from rules.policy import Policy

Current = Callable[[], tuple[Policy, RuleEngine]]  # the revision in force, read atomically
# The rules that matched a subject: the revision's policy, its engine's name, and the indices
# of the rules matched in policy.rules_for(subject), ascending (never empty).
Matched = tuple[Policy, str, Sequence[int]]


def facts_read(policy: Policy, subject: Subject) -> tuple[str, ...]:
    """The fact names the subject's conditions read, sorted."""
    rules = policy.rules_for(subject)
    return tuple(sorted(set().union(*(expr.facts_used(r.condition) for r in rules))))


class MemoEngine:
    """A `RuleEngine` that asks `engine` once per distinct combination of the values of the
    facts the conditions read, and answers every later subject with the same values from memo.

    A value's type is part of the key: `1`, `1.0` and `True` are equal in Python, and the
    memo must not assume an engine treats them alike."""

    def __init__(self, policy: Policy, engine: RuleEngine) -> None:
        self.name = engine.name
        self.engine = engine
        self.revision = policy.revision
        self._keys: dict[Subject, Callable[[Mapping[str, Any]], tuple[Any, ...]]] = {}
        self._subjects: dict[Subject, _Seen] = {}
        for subject in Subject:
            names = facts_read(policy, subject)
            self._keys[subject] = _values_of(names)
            self._subjects[subject] = _Seen(subject, names)
        self._seen: dict[tuple[Any, ...], Sequence[int]] = {}
        # The subject of the last call, and its memo: a pass decides every lease, then every
        # GPU, and an enum's hash is a Python call, worth saving 150,000 times a pass.
        self._last = self._subjects[Subject.LEASE]
        self.asked = 0  # subjects the engine evaluated
        self.answered = 0  # subjects answered from the memo

    def match(self, subject: Subject, facts: Mapping[str, Any]) -> Sequence[int]:
        values = self._keys[subject](facts)
        key = (subject, values, tuple(map(type, values)))
        found = self._seen.get(key)
        if found is not None:
            self.answered += 1
            return found
        found = self._seen[key] = tuple(sorted(self.engine.match(subject, facts)))
        self.asked += 1
        return found

    def checked_match(self, subject: Subject, facts: Mapping[str, Any]) -> Sequence[int]:
        """`match`, refusing incomplete or mistyped facts as `rules.engine.decide` does.

        One lookup does both: the key is the type of every fact, in the catalogue's order,
        and the values of the facts the conditions read. Facts with the catalogue's names
        and the types of facts checked before pass check_facts as those did (its verdict
        depends on nothing else), so only a new key is checked, then evaluated."""
        seen = self._last
        if seen.subject is not subject:
            seen = self._last = self._subjects[subject]
        try:
            if len(facts) != seen.size:
                raise KeyError(subject)
            # As many facts as the catalogue has, and every one of its names: the same names.
            key = (tuple(map(type, seen.every(facts))), seen.read(facts))
            found = seen.matched.get(key)
        except (KeyError, TypeError):  # a name missing or unknown; an unhashable value
            check_facts(subject, facts)  # says which (FactError)
            raise
        if found is not None:
            self.answered += 1
            return found
        check_facts(subject, facts)
        found = seen.matched[key] = tuple(sorted(self.engine.match(subject, facts)))
        self.asked += 1
        return found

    def close(self) -> None:
        """Forget the memo; the wrapped engine belongs to the live policy, which closes it."""
        self._seen.clear()
        for seen in self._subjects.values():
            seen.clear()


class _Seen:
    """One subject's memo: the rules matched, by the types of all its facts and the values of
    the facts its conditions read."""

    def __init__(self, subject: Subject, read: tuple[str, ...]) -> None:
        self.subject = subject
        catalogue = tuple(CATALOGUE[subject])
        self.size = len(catalogue)
        self.every = _values_of(catalogue)
        self.read = _values_of(read)
        self.matched: dict[tuple[Any, ...], Sequence[int]] = {}
        # Facts checked before, by their shape: their names in order and each value's type;
        # for each shape, the rules matched by the values of the facts read.
        self.shapes: dict[tuple[tuple[str, ...], tuple[type, ...]], dict[Any, Sequence[int]]] = {}
        # The shape last learned, answered without a lookup of the shape.
        self.names: tuple[str, ...] = ()
        self.types: tuple[type, ...] = ()
        self.by_read: dict[Any, Sequence[int]] = {}

    def learn(self, facts: Mapping[str, Any], found: Sequence[int]) -> None:
        """Keep what `checked_match` found for `facts` (which passed check_facts) by their
        shape and the values read, and make their shape the one answered first."""
        names, types = tuple(facts), tuple(map(type, facts.values()))
        self.by_read = self.shapes.setdefault((names, types), {})
        self.by_read[self.read(facts)] = found
        self.names, self.types = names, types

    def clear(self) -> None:
        self.matched.clear()
        self.shapes.clear()
        self.names, self.types, self.by_read = (), (), {}


def _values_of(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of `names` in a fact, as a tuple (however many names)."""
    if not names:
        return lambda _facts: ()
    if len(names) == 1:
        one = names[0]
        return lambda facts: (facts[one],)
    return itemgetter(*names)


class PassDecisions:
    """`decide(subject, facts)` for one sweep pass, through a memo of the revision in force.

    Made anew for every pass, so no pass sees the memo of another (nor of an older revision);
    within the pass, a reload swaps in a fresh memo for the new revision."""

    def __init__(self, current: Current) -> None:
        self._current = current
        self._memos: list[MemoEngine] = []  # the last one answers; one per revision seen

    @property
    def asked(self) -> int:
        """Subjects the engine evaluated in this pass."""
        return sum(m.asked for m in self._memos)

    @property
    def answered(self) -> int:
        """Subjects answered from the memo in this pass."""
        return sum(m.answered for m in self._memos)

    def decide(self, subject: Subject, facts: Mapping[str, Any]) -> Decision:
        """The decision on one subject. The Decision keeps `facts` as given when they are a
        dict (no copy per subject: the sweep builds them for this call alone)."""
        policy, memo, found = self._match(subject, facts)
        if not found and subject != Subject.REQUEST and type(facts) is dict:
            # Most sweep subjects: nothing to do; as rules.engine._decision makes it.
            return Decision(subject, policy.revision, memo.name, facts, (), "default", None)
        rules = policy.rules_for(subject)
        # As rules.engine.decide makes it, from the subject's own facts.
        return _decision(policy, memo.name, subject, facts, [rules[i] for i in found])

    def acted_on(self, subject: Subject, facts: Mapping[str, Any]) -> Decision | None:
        """`decide` for a sweep subject, but None where no rule matched: nothing to do and
        nothing to record, so no Decision is made (most of the 100,000 GPUs of a sweep)."""
        matched = self.matched(subject, facts)
        return None if matched is None else self.decision(subject, facts, matched)

    def matched(self, subject: Subject, facts: Mapping[str, Any]) -> Matched | None:
        """The rules that match a sweep subject, as `acted_on` finds them, None where none
        does: `decision` makes the Decision, so a caller that finds nothing to do in the
        rules alone (their verdicts) makes none."""
        assert subject != Subject.REQUEST, "a request always has a decision"
        policy, engine = self._current()
        last = self._memos[-1] if self._memos else None
        if last is None or last.engine is not engine:
            policy, last, found = self._match(subject, facts)
        else:  # the usual case: the memo of the revision in force answers at once
            # A lookup cheaper than checked_match's (150,000 subjects a pass): facts of the
            # shape last answered (the same names in the same order, each value of the same
            # type) passed the same check, so the values read alone say which rules match.
            seen = last._last
            got = None
            if seen.subject is subject:
                try:
                    if (
                        tuple(map(type, facts.values())) == seen.types
                        and tuple(facts) == seen.names
                    ):
                        got = seen.by_read.get(seen.read(facts))
                except TypeError:  # an unhashable value: checked_match refuses it
                    got = None
            if got is not None:
                last.answered += 1
                found = got
            else:  # a new shape or values: checked_match answers, and the shape is kept
                try:
                    found = last.checked_match(subject, facts)
                except RevisionRetiredError:
                    policy, last, found = self._match(subject, facts)
                else:
                    last._last.learn(facts, found)
        if not found:
            return None
        return policy, last.name, found

    @staticmethod
    def decision(subject: Subject, facts: Mapping[str, Any], matched: Matched) -> Decision:
        """The Decision on a subject the rules `matched` (as rules.engine.decide makes it)."""
        policy, engine, found = matched
        rules = policy.rules_for(subject)
        return _decision(policy, engine, subject, facts, [rules[i] for i in found])

    def _match(
        self, subject: Subject, facts: Mapping[str, Any]
    ) -> tuple[Policy, MemoEngine, Sequence[int]]:
        """The rules of the revision in force that match, checked and through its memo."""
        while True:
            policy, engine = self._current()
            memo = self._memos[-1] if self._memos else None
            if memo is None or memo.engine is not engine:
                if memo is not None:
                    memo.close()
                memo = MemoEngine(policy, engine)
                self._memos.append(memo)
            try:
                return policy, memo, memo.checked_match(subject, facts)
            except RevisionRetiredError:
                continue  # raced with a reload: the new revision answers, from a new memo

    def close(self) -> None:
        for memo in self._memos:
            memo.close()
