"""Loading rule files into a Policy: schema per file, then what spans files.

`load_policy` takes the rule files as text (the caller reads the directory), validates each one
against rules.schema, checks what spans files, parses every `when` and `because`, and returns an
immutable Policy. Every problem found is reported with its file, line and column; nothing
partial is ever returned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from rules import expr, expr_parser
from rules.cases import load_cases
from rules.catalogue import CATALOGUE
from rules.domain import Outcome, Subject
from rules.errors import PolicyError, Problem
from rules.policy import (
    PLACEHOLDER,
    Approvals,
    Backfill,
    Case,
    Digest,
    FleetLimits,
    Limits,
    Policy,
    Pool,
    Preemption,
    QueueRules,
    Quota,
    Recall,
    Reports,
    Rule,
    Team,
    Timing,
    Verdict,
    WorkingHours,
    parse_request_then,
    parse_sweep_then,
    placeholder_fact,
    then_help,
)
from rules.schema import (
    ApprovalsSpec,
    CaseFile,
    DigestSpec,
    FleetSpec,
    LimitsSpec,
    PolicyFile,
    PreemptionSpec,
    QueueSpec,
    RecallSpec,
    ReportsSpec,
    WarningsSpec,
)
from rules.schema_problems import schema_problems
from rules.yamlsrc import Located, parse


def revision_of(sources: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    return digest.hexdigest()[:16]


def load_policy(sources: Mapping[str, str]) -> Policy:
    """Build a Policy from {relative path: YAML text}; files under tests/ hold cases."""
    problems: list[Problem] = []
    docs: list[tuple[Located, PolicyFile]] = []
    case_docs: list[tuple[Located, CaseFile]] = []
    for name in sorted(sources):
        try:
            located = parse(name, sources[name])
        except PolicyError as exc:
            problems += exc.problems
            continue
        is_case = name.startswith("tests/") or "/tests/" in name
        model = CaseFile if is_case else PolicyFile
        if located.data is None:
            if is_case:
                problems.append(Problem(name, 1, 1, "a case file needs `cases:`"))
            continue
        try:
            parsed = model.model_validate(located.data)
        except ValidationError as exc:
            problems += schema_problems(located, exc)
            continue
        if isinstance(parsed, CaseFile):
            case_docs.append((located, parsed))
        else:
            docs.append((located, parsed))
    if problems:
        raise PolicyError(problems)
    builder = _Builder(docs)
    policy = builder.build(revision_of(sources), tuple(sorted(sources)))
    cases = load_cases(case_docs, policy, builder.problems, builder.rule_ids)
    if builder.problems:
        raise PolicyError(builder.problems)
    return _replace_cases(policy, cases)


def _replace_cases(policy: Policy, cases: tuple[Case, ...]) -> Policy:
    return replace(policy, cases=cases)


class _Builder:
    """Merges the policy files and checks what spans them, collecting located problems."""

    def __init__(self, docs: list[tuple[Located, PolicyFile]]) -> None:
        self.docs = docs
        self.problems: list[Problem] = []
        self.rule_ids: set[str] = set()  # every id written, also of rules that failed to load
        self.owner: dict[str, Located] = {}

    def once(self, section: str) -> tuple[Located, Any] | None:
        found = [(doc, getattr(spec, section)) for doc, spec in self.docs]
        found = [(doc, value) for doc, value in found if value is not None]
        for doc, _ in found[1:]:
            first = found[0][0].file
            self.problems.append(
                doc.at((section,), f"`{section}` is already defined in {first}", key=True)
            )
        return found[0] if found else None

    def merged(self, section: str) -> dict[str, tuple[Located, Any]]:
        out: dict[str, tuple[Located, Any]] = {}
        for doc, spec in self.docs:
            for key, value in (getattr(spec, section) or {}).items():
                if key in out:
                    self.problems.append(
                        doc.at(
                            (section, key),
                            f"{section[:-1]} {key!r} is already defined in {out[key][0].file}",
                            key=True,
                        )
                    )
                    continue
                out[key] = (doc, value)
        return out

    def require(self, section: str) -> None:
        anchor = self.docs[0][0].file if self.docs else "(no rule files)"
        self.problems.append(Problem(anchor, 1, 1, f"no file defines `{section}`"))

    def build(self, revision: str, files: tuple[str, ...]) -> Policy:
        admins_at = self.once("admins")
        accounts_at = self.once("accounts")
        names_at = self.once("names")
        limits_at = self.once("limits")
        warnings_at = self.once("warnings")
        recall_at = self.once("recall")
        queue_at = self.once("queue")
        preemption_at = self.once("preemption")
        fleet_at = self.once("fleet")
        automation_at = self.once("automation")
        default_at = self.once("default")
        approvals_at = self.once("approvals")
        reports_at = self.once("reports")
        approvals = _approvals(approvals_at[1] if approvals_at else None, Approvals())
        teams = self._teams(approvals)
        if admins_at is None:
            self.require("admins")
        limits = _limits(limits_at[1] if limits_at else LimitsSpec())
        pools = self._pools(teams, limits)
        timing = _timing(warnings_at[1] if warnings_at else WarningsSpec())
        default_spec = default_at[1] if default_at else None
        if default_at is not None:
            self._check_because(
                default_at[0],
                ("default", "because"),
                default_at[1].because,
                CATALOGUE[Subject.REQUEST],
            )
        default = parse_request_then(default_spec.then if default_spec else "ask")
        team_of: dict[str, str] = {}
        for team in teams.values():
            for user in team.members | team.managers:
                team_of.setdefault(user, team.name)
        rules = self._rules(teams, pools)
        return Policy(
            revision=revision,
            admins=frozenset(admins_at[1] if admins_at else ()),
            accounts=dict(accounts_at[1] if accounts_at else {}),
            names=dict(names_at[1] if names_at else {}),
            teams=teams,
            pools=pools,
            limits=limits,
            timing=timing,
            automation_paused=(automation_at[1] == "paused") if automation_at else False,
            default=default or Verdict(outcome=Outcome.ASK, approvers="managers"),
            default_because=(
                default_spec.because if default_spec else "no rule matched, so a manager decides"
            ),
            rules=rules,
            cases=(),
            files=files,
            recall=Recall(**(recall_at[1] if recall_at else RecallSpec()).model_dump()),
            queue=_queue(queue_at[1] if queue_at else QueueSpec()),
            preemption=Preemption(
                (preemption_at[1] if preemption_at else PreemptionSpec()).within_team
            ),
            fleet=FleetLimits(**(fleet_at[1] if fleet_at else FleetSpec()).model_dump()),
            approvals=approvals,
            reports=_reports(reports_at[1] if reports_at else ReportsSpec()),
            _team_of=team_of,
        )

    def _teams(self, approvals: Approvals) -> dict[str, Team]:
        specs = self.merged("teams")
        if not specs:
            self.require("teams")
        seen: dict[str, str] = {}
        teams = {}
        for name, (doc, spec) in specs.items():
            for i, user in enumerate(spec.members):
                if user in seen and seen[user] != name:
                    self.problems.append(
                        doc.at(
                            ("teams", name, "members", i),
                            f"{user} is already a member of team {seen[user]!r}; "
                            "a person belongs to one team",
                        )
                    )
                seen.setdefault(user, name)
            channel = spec.approval if isinstance(spec.approval, str) else spec.approval.channel
            teams[name] = Team(
                name=name,
                managers=frozenset(spec.managers),
                members=frozenset(spec.members),
                approval_channel=None if channel == "managers" else channel,
                approvals=_approvals(spec.approvals, approvals) if spec.approvals else None,
            )
        return teams

    def _pools(self, teams: Mapping[str, Team], limits: Limits) -> dict[str, Pool]:
        specs = self.merged("pools")
        if not specs:
            self.require("pools")
        node_pool: dict[str, str] = {}
        pools = {}
        for name, (doc, spec) in specs.items():
            for node in spec.nodes:
                if node in node_pool:
                    self.problems.append(
                        doc.at(
                            ("pools", name, "nodes", node),
                            f"node {node!r} is already in pool {node_pool[node]!r}",
                            key=True,
                        )
                    )
                node_pool.setdefault(node, name)
            quotas = {}
            for team, q in spec.quotas.items():
                at = ("pools", name, "quotas", team)
                if team not in teams:
                    known = ", ".join(sorted(teams)) or "none"
                    self.problems.append(
                        doc.at(at, f"unknown team {team!r} (teams: {known})", key=True)
                    )
                lending = q.nominal if q.lending_limit is None else q.lending_limit
                if lending > q.nominal:
                    self.problems.append(
                        doc.at(
                            (*at, "lending_limit"),
                            f"lending_limit {lending} exceeds nominal {q.nominal}: a team can "
                            "only lend GPUs it is guaranteed",
                        )
                    )
                quotas[team] = Quota(q.nominal, q.borrowing_limit, lending, q.weight)
            size = sum(spec.nodes.values())
            total = sum(q.nominal for q in quotas.values())
            if quotas and total != size:
                parts = " + ".join(f"{t} {q.nominal}" for t, q in quotas.items())
                self.problems.append(
                    doc.at(
                        ("pools", name, "quotas"),
                        f"nominal quotas add up to {total} ({parts}) but pool {name!r} has "
                        f"{size} GPUs; they must add up to the pool's size",
                    )
                )
            override = {k: v for k, v in spec.limits.model_dump().items() if v is not None}
            pool_limits = Limits(**{**limits.__dict__, **override})
            pools[name] = Pool(
                name,
                spec.model,
                spec.protected,
                dict(spec.nodes),
                quotas,
                pool_limits,
                spec.cost_per_gpu_hour,
            )
        return pools

    def _check_because(
        self, doc: Located, at: tuple[Any, ...], text: str, facts: Mapping[str, Any]
    ) -> None:
        for m in PLACEHOLDER.finditer(text):
            if placeholder_fact(m.group(1)) not in facts:
                self.problems.append(
                    doc.at(
                        at,
                        expr_parser.unknown_fact(placeholder_fact(m.group(1)), facts),
                        offset=m.start() + 1,
                    )
                )

    def _check_names(
        self,
        doc: Located,
        at: tuple[Any, ...],
        node: expr.Node,
        teams: Mapping[str, Team],
        pools: Mapping[str, Pool],
    ) -> None:
        """A rule comparing a pool or team fact with a name nobody defined is a typo."""
        for fact, value, offset in expr.constants(node):
            kind = fact.rsplit(".", 1)[-1]
            known: Mapping[str, object] | None = {"pool": pools, "team": teams}.get(kind)
            if known is not None and value not in known:
                names = ", ".join(sorted(known)) or "none"
                self.problems.append(
                    doc.at(at, f"unknown {kind} {value!r} (known: {names})", offset=offset)
                )

    def _rules(self, teams: Mapping[str, Team], pools: Mapping[str, Pool]) -> tuple[Rule, ...]:
        rules: list[Rule] = []
        ids: dict[str, str] = {}
        for doc, spec in self.docs:
            for i, r in enumerate(spec.rules or ()):
                at = ("rules", i)
                if r.id in ids:
                    self.problems.append(
                        doc.at((*at, "id"), f"duplicate rule id {r.id!r} (first in {ids[r.id]})")
                    )
                    continue
                ids[r.id] = f"{doc.file}:{doc.values[(*at, 'id')][0]}"
                self.rule_ids.add(r.id)
                subject = Subject(r.on)
                facts = CATALOGUE[subject]
                try:
                    node = expr_parser.parse(r.when, facts)
                except expr.ExprError as exc:
                    self.problems.append(doc.at((*at, "when"), str(exc), offset=exc.offset))
                    continue
                self._check_names(doc, (*at, "when"), node, teams, pools)
                verdict = (
                    parse_request_then(r.then)
                    if subject == Subject.REQUEST
                    else parse_sweep_then(r.then)
                )
                if verdict is None:
                    self.problems.append(doc.at((*at, "then"), then_help(subject, r.then)))
                    continue
                self._check_because(doc, (*at, "because"), r.because, facts)
                rules.append(
                    Rule(
                        id=r.id,
                        subject=subject,
                        when=r.when,
                        condition=node,
                        verdict=verdict,
                        because=r.because,
                        observe=r.mode == "observe",
                        file=doc.file,
                        line=doc.values[at][0],
                    )
                )
        return tuple(rules)


def _limits(spec: LimitsSpec) -> Limits:
    return Limits(**spec.model_dump())


def _timing(spec: WarningsSpec) -> Timing:
    return Timing(
        expiry_leads=tuple(sorted(set(spec.expiry_leads), reverse=True)),
        idle_threshold=spec.idle_threshold,
        grace=spec.grace,
        snooze=spec.snooze,
        max_snoozes=spec.max_snoozes,
        stale_after=spec.stale_after,
    )


def _queue(spec: QueueSpec) -> QueueRules:
    return QueueRules(Backfill(spec.backfill), spec.fair_share_half_life)


def _approvals(spec: ApprovalsSpec | None, base: Approvals) -> Approvals:
    """The keys `spec` sets, over `base` (the defaults, or the lab-wide section for a team)."""
    if spec is None:
        return base
    given: dict[str, Any] = {
        key: getattr(spec, key)
        for key in spec.model_fields_set
        if getattr(spec, key) is not None or key == "escalate_after"  # None there: never
    }
    if "escalate_to" in given:
        given["escalate_to"] = tuple(given["escalate_to"] or ("admins",))
    hours = given.get("working_hours")
    if hours is not None:
        given["working_hours"] = WorkingHours(hours.days, hours.start, hours.end, hours.tz)
    return replace(base, **given)


def _reports(spec: ReportsSpec) -> Reports:
    def digest(d: DigestSpec | None, channel: str | None = None) -> Digest | None:
        return Digest(d.day, d.at, d.tz, channel) if d is not None else None

    lab = spec.lab_digest
    return Reports(
        currency=spec.currency,
        keep_hourly=spec.keep_hourly,
        busy_again_within=spec.busy_again_within,
        lab_digest=digest(lab, lab.channel) if lab is not None else None,
        personal_digests=digest(spec.personal_digests),
    )
