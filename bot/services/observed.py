"""The observe-mode report: what each rule in `mode: observe` would have done over a window,
and how often a lease was busy again soon after a would-have reclaim (the rule's false
positives), so an admin can switch a rule to act on evidence. `gpubot report observe` prints
it; `render` is its plain text for any front."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

from bot.services.context import Context
from bot.services.overview import BUSY_PCT
from rules.domain import Subject, format_duration
from rules.observed import After, Tally, after, false_positive_line
from rules.policy import Policy
from storage import observed as store
from storage.db import Database
from storage.observed import WouldHave

State = Literal["observe", "enforced now", "gone"]
Checked = tuple[WouldHave, After | None]  # a would-have, and what came of it if a reclaim


@dataclass(frozen=True)
class RuleObserved:
    """One rule's would-haves in the window. `state`: still in observe mode, enforced now, or
    gone from the rule files; `verdicts`: how often it would have done what; `affected`: the
    leases or requests it would have touched; `actual`: for requests, what applied instead."""

    rule: str
    subject: str
    state: State
    verdicts: tuple[tuple[str, int], ...] = ()
    affected: int = 0
    actual: tuple[tuple[str, int], ...] = ()
    reclaims: Tally = field(default_factory=Tally)

    @property
    def noun(self) -> str:
        return "request" if self.subject == Subject.REQUEST else "lease"


@dataclass(frozen=True)
class ObservedReport:
    since: datetime
    until: datetime
    within: timedelta  # a busy minute this soon after a would-have reclaim counts against it
    busy_pct: float
    rules: tuple[RuleObserved, ...]


def observed(ctx: Context, since: datetime, until: datetime) -> ObservedReport:
    """Every rule now in observe mode, and every rule that recorded a would-have in
    [since, until) (those since enforced or removed marked so), in the rule files' order."""
    return observed_in(ctx.db, ctx.policy, since, until)


def observed_in(db: Database, policy: Policy, since: datetime, until: datetime) -> ObservedReport:
    """`observed` over a database and rules at hand (the command line loads no engine)."""
    within = policy.reports.busy_again_within
    by_rule: dict[str, list[Checked]] = {}
    with db.read() as session:
        for would in store.would_haves(session, since, until):
            came = None
            lease = would.lease_id
            if lease is not None and would.verdict.startswith("reclaim"):
                stop = min(would.at + within, until)
                facts = store.afterwards(session, lease, would.at, stop, busy_pct=BUSY_PCT)
                came = after(facts, would.at, within, until)
            by_rule.setdefault(would.rule, []).append((would, came))
    rules = [_one(policy, rule, by_rule.get(rule, [])) for rule in _order(policy, by_rule)]
    return ObservedReport(since, until, within, BUSY_PCT, tuple(rules))


def _order(policy: Policy, found: Iterable[str]) -> list[str]:
    known = [r.id for r in policy.rules if r.observe or r.id in found]
    return known + sorted(set(found) - set(known))


def _one(policy: Policy, rule: str, checked: list[Checked]) -> RuleObserved:
    found = [would for would, _ in checked]
    defined = next((r for r in policy.rules if r.id == rule), None)
    if defined is None:
        state: State = "gone"
        subject = Subject.REQUEST if found[0].subject.startswith("request:") else Subject.LEASE
    else:
        state, subject = ("observe" if defined.observe else "enforced now"), defined.subject
    tally = Tally()
    for _, came in checked:
        if came is not None:
            tally = tally.add(came)
    return RuleObserved(
        rule=rule,
        subject=str(subject),
        state=state,
        verdicts=tuple(Counter(w.verdict for w in found).most_common()),
        affected=len({w.subject for w in found}),
        actual=tuple(Counter(w.actual for w in found if w.actual).most_common()),
        reclaims=tally,
    )


# ---- plain text and JSON ----------------------------------------------------------------

_STATE_WORDS = {
    "observe": "observe mode",
    "enforced now": "enforced now",
    "gone": "no longer in the rules",
}


def render(report: ObservedReport, *, tz: tzinfo = UTC) -> str:
    """The report as plain text, one block per rule."""

    def shown(when: datetime) -> str:
        return when.astimezone(tz).strftime("%Y-%m-%d %H:%M %Z")

    lines = [f"Observe-only rules from {shown(report.since)} to {shown(report.until)}"]
    if not report.rules:
        lines.append("No rule is in observe mode, and none recorded a would-have in this window.")
    for rule in report.rules:
        lines.append(f"{rule.rule} ({rule.subject} rule, {_STATE_WORDS[rule.state]})")
        lines.extend(f"  {line}" for line in _rule_lines(rule, report.within))
    return "\n".join(lines)


def _rule_lines(rule: RuleObserved, within: timedelta) -> list[str]:
    if not rule.verdicts and rule.subject == Subject.GPU:
        return ["the sweep records no would-have for a GPU rule, so there is nothing to count"]
    if not rule.verdicts:
        return ["would have done nothing in this window"]
    done = ", ".join(f"{verdict} {_times(n)}" for verdict, n in rule.verdicts)
    noun = rule.noun if rule.affected == 1 else f"{rule.noun}s"
    lines = [f"would have done: {done}, to {rule.affected} {noun}"]
    if rule.actual:
        lines.append("what applied instead: " + ", ".join(f"{o} {n}" for o, n in rule.actual))
    if rule.reclaims.total:
        lines.append(false_positive_line(rule.reclaims, within))
    return lines


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def as_json(report: ObservedReport) -> list[dict[str, Any]]:
    """One object per rule, for programs: ids and UTC times, rates as fractions."""
    return [
        {
            "rule": rule.rule,
            "subject": rule.subject,
            "state": rule.state,
            "since": report.since.astimezone(UTC).isoformat(),
            "until": report.until.astimezone(UTC).isoformat(),
            "would_have": dict(rule.verdicts),
            "affected": rule.affected,
            "actual": dict(rule.actual),
            "reclaims": {
                "busy_again": rule.reclaims.busy,
                "not_busy_again": rule.reclaims.idle,
                "unknown": rule.reclaims.unknown,
                "too_recent": rule.reclaims.pending,
                "false_positive_rate": rule.reclaims.false_positive_rate,
                "busy_again_within": format_duration(report.within),
            },
        }
        for rule in report.rules
    ]
