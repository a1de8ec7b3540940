"""`/gpu ...`: help and typos are answered in the ack; everything else is recorded in the inbox,
acked, and carried out by a worker (`carry_out`), whose reply goes out through the outbox.

The ack path parses with the person's time zone only if it is known already (users.info is a
Slack call, and nothing before an ack makes one); the worker parses again with the zone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from slack_bolt import Ack, App

from bot.services import Refused
from bot.services import observed as observed_use
from bot.services import reports as report_use
from bot.services.results import BorrowResult
from bot.services.rule_files import RulesDirError
from bot.slack import parse as p
from bot.slack.blocks import (
    borrow_modal,
    borrow_reply,
    explanation_message,
    extend_reply,
    help_message,
    problem_message,
    refused_message,
    release_reply,
)
from bot.slack.blocks.devices import nodes_message
from bot.slack.blocks.kit import Message, context, escape, mention, message, section
from bot.slack.blocks.overview import (
    mine_message,
    named_gpus,
    queue_message,
    quota_message,
    status_message,
)
from bot.slack.blocks.reports import report_message
from bot.slack.blocks.shrinking import shrink_reply
from bot.slack.deps import own_team
from bot.slack.inbox import Answer
from bot.slack.people import UTC_ZONE, Zone
from rules.approvals import most_gpus, pools_for
from rules.domain import Outcome
from rules.errors import PolicyError
from rules.reports import Scope, ScopeKind, WindowError, parse_window
from storage.tables import InboxRow

if TYPE_CHECKING:
    from bot.slack.deps import SlackDeps

#: The fields of a slash command a worker needs (the rest of Slack's form is not kept).
FIELDS = ("user_id", "text", "channel_id", "team_id", "response_url", "trigger_id")


def register(app: App, deps: SlackDeps) -> None:
    @app.command("/gpu")
    def gpu(ack: Ack, body: dict[str, Any], command: dict[str, Any]) -> None:
        user, text = str(command["user_id"]), str(command.get("text") or "")
        tz = deps.people.known_tz(user) or UTC_ZONE
        parsed = parse_command(deps, text, tz)
        if isinstance(parsed, p.ParseProblem):
            ack(**problem_message(parsed).as_kwargs())
            return
        if isinstance(parsed, p.Help):
            ack(**help_message(parsed.topic).as_kwargs())
            return
        payload = {name: str(command.get(name) or "") for name in FIELDS}
        deps.accept(ack, body, kind="command", actor=user, payload=payload)


def carry_out(deps: SlackDeps, row: InboxRow, zone: Zone | None) -> Answer:
    """A recorded /gpu command: its use case, and the reply."""
    user, text = row.actor, str(row.payload.get("text", ""))
    tz = zone.tz if zone is not None else UTC_ZONE
    parsed = parse_command(deps, text, tz)
    if isinstance(parsed, p.ParseProblem):  # the person's own zone can make an end time wrong
        return Answer(reply=problem_message(parsed))
    if isinstance(parsed, p.Help):
        return Answer(reply=help_message(parsed.topic))
    if isinstance(parsed, p.OpenBorrowModal):
        return Answer(view=borrow_form(deps, user))
    if isinstance(parsed, p.Why | p.Audit):
        return Answer(reply=explained(deps, user, parsed, zone))
    if isinstance(parsed, p.Report) and parsed.observe:
        return Answer(reply=observed_rules(deps, user, parsed, zone))
    if isinstance(parsed, p.Report):
        return Answer(reply=reported(deps, user, parsed, zone))
    return Answer(reply=owning_up(run(deps, user, parsed), zone))


def parse_command(deps: SlackDeps, text: str, tz: ZoneInfo) -> p.Command | p.ParseProblem:
    policy = deps.services.policy
    return p.parse(text, now=deps.now(), tz=tz, pools=list(policy.pools), teams=list(policy.teams))


def report_scope(deps: SlackDeps, user: str, command: p.Report) -> Scope | Refused:
    """The scope typed, or the person's default; `team` alone is their own team."""
    if command.scope is None:
        return report_use.default_scope(deps.services.ctx, user)
    if command.scope is ScopeKind.TEAM and not command.name:
        team = own_team(deps.services, user)
        if team is None:
            return Refused("You are in no team; name one: `/gpu report team vision`.", "no-team")
        return Scope(ScopeKind.TEAM, team)
    return Scope(command.scope, command.name)


def reported(deps: SlackDeps, user: str, command: p.Report, zone: Zone | None) -> Message:
    """`/gpu report`: the figures in the reader's zone, people by name (looked up before the
    unit of work, `SlackDeps.look_up`)."""
    tz = zone.tz if zone is not None else UTC_ZONE
    names = deps.people.known_names
    scope = report_scope(deps, user, command)
    if isinstance(scope, Refused):
        return refused_message(scope)
    try:
        window = parse_window(command.window, deps.now(), tz)
    except WindowError as exc:  # read already in the ack; the person's zone moved a month
        return refused_message(Refused(str(exc), "window"))
    found = report_use.build(deps.services.ctx, user, scope, window, tz=tz)
    if isinstance(found, Refused):
        return refused_message(replace(found, message=names(found.message)))
    # A lease held now is in no hour summed yet when it began this hour: named, not missed.
    running = deps.services.leases(user) if found.scope.kind is ScopeKind.ME else []
    return report_message(
        found,
        viewer=user,
        window_text=command.window,
        tz=tz,
        label=lambda who: names(mention(who)),
        zone=tz.key if zone is not None and zone.known else "UTC: Slack did not tell me yours",
        running=running,
    )


def observed_rules(deps: SlackDeps, user: str, command: p.Report, zone: Zone | None) -> Message:
    """`/gpu report observe [30d]`, for admins: what each observe-only rule would have done, and
    how often a would-have reclaim's lease was busy again soon after."""
    ctx = deps.services.ctx
    if not ctx.policy.is_admin(user):
        return refused_message(
            Refused("Only admins see what observe-only rules would have done.", "not-allowed")
        )
    tz = zone.tz if zone is not None else UTC_ZONE
    try:
        window = parse_window(command.window or "30d", deps.now(), tz)
    except WindowError as exc:
        return refused_message(Refused(str(exc), "window"))
    found = observed_use.observed(ctx, window.since, window.until)
    text = deps.people.known_names(observed_use.render(found, tz=tz))
    first, _, rest = text.partition("\n")
    blocks = [section(f"*{escape(first)}*")]
    if rest:
        blocks.append(section(f"```{escape(rest)}```"))
    return message(first, blocks)


def explained(deps: SlackDeps, user: str, command: p.Why | p.Audit, zone: Zone | None) -> Message:
    """`why` and `audit` for their reader: times in the reader's zone, people by name (both
    looked up before the unit of work, `SlackDeps.look_up`)."""
    tz = zone.tz if zone is not None else UTC_ZONE
    services, names = deps.services, deps.people.known_names
    ask = services.audit if isinstance(command, p.Audit) else services.why
    found = ask(user, command.ref, tz=tz)
    if isinstance(found, Refused):
        return refused_message(replace(found, message=names(found.message)))
    shown = replace(
        found, summary=names(found.summary), lines=tuple(names(line) for line in found.lines)
    )
    label = tz.key if zone is not None and zone.known else "UTC: Slack did not tell me yours"
    return explanation_message(shown, label)


def owning_up(reply: Message, zone: Zone | None) -> Message:
    """A reply to an end time read in UTC because Slack could not say the person's zone
    says so, so nobody is surprised by a lease ending hours off."""
    if zone is None or zone.known:
        return reply
    note = context(
        ":information_source: Times were read in UTC: Slack did not tell me your time zone "
        "just now. `/gpu mine` shows the end time in yours."
    )
    return message(reply.text, [*reply.blocks, note])


def borrow_form(deps: SlackDeps, user: str) -> dict[str, Any]:
    """The borrow modal: only the pools the person's team may use, the first preset."""
    policy = deps.services.policy
    team = policy.team_of(user)
    pools = pools_for(policy, team)
    most = max((most_gpus(policy, team.name, p) for p in pools), default=0) if team else 0
    return borrow_modal(pools, pools[0] if pools else None, deps.now(), most_gpus=most)


def run(deps: SlackDeps, user: str, command: p.Command) -> Message:
    """Every subcommand but help and the modal: a use case, then its reply."""
    services = deps.services
    match command:
        case p.Borrow():
            return borrowed(deps, services.borrow(user, command.to_ask()))
        case p.Extend():
            return _extend(deps, user, command)
        case p.Release():
            return _reply(services.release(user, command.lease_id), release_reply)
        case p.Shrink():
            shrunk = services.shrink(user, command.lease_id, gpus=command.gpus, keep=command.keep)
            return _reply(shrunk, shrink_reply)
        case p.Mine():
            return mine_message(services.leases(user), services.requests(user))
        case p.Admin():
            return _admin(deps, user, command)
        case _:
            return _look(deps, user, command)


def _look(deps: SlackDeps, user: str, command: p.Command) -> Message:
    """The subcommands that only read: status, queue, quota, why, audit and nodes."""
    services = deps.services
    match command:
        case p.Status():
            return _status(deps, user)
        case p.Queue():
            return queue_message(services.queue_explained())
        case p.Quota():
            return _quota(deps, user, command)
        case p.Why():
            return _reply(services.why(user, command.ref), explanation_message)
        case p.Audit():
            return _reply(services.audit(user, command.ref), explanation_message)
        case p.Nodes():
            return _nodes(deps, user, command)
    return help_message(None)


def _extend(deps: SlackDeps, user: str, command: p.Extend) -> Message:
    services = deps.services
    lease = services.lease(command.lease_id)
    if lease is None:
        return refused_message(Refused(f"There is no lease L{command.lease_id}."))
    by = command.amount(lease.expires_at)
    return _reply(services.extend(user, command.lease_id, by, command.reason), extend_reply)


def _status(deps: SlackDeps, user: str) -> Message:
    services = deps.services
    shown = status_message(services.status())
    if services.policy.is_admin(user):  # admins also see where ledger and fleet disagree
        for title, found in (
            ("*In use without a lease* (never offered while it lasts)", services.unreserved()),
            ("*Someone else's process on a leased GPU*", services.intrusions()),
        ):
            if found:
                shown.blocks.append(named_gpus(title, found))
    return shown


def _quota(deps: SlackDeps, user: str, command: p.Quota) -> Message:
    team = command.team or _team_of(deps, user)
    if team is None:
        return refused_message(Refused("You are in no team; name one: `/gpu quota vision`."))
    quotas = deps.services.quota(team)
    return refused_message(quotas) if isinstance(quotas, Refused) else quota_message(quotas, team)


def _nodes(deps: SlackDeps, user: str, command: p.Nodes) -> Message:
    services = deps.services
    nodes = services.nodes(user, command.node)
    if isinstance(nodes, Refused):
        return refused_message(nodes)
    if command.node:
        events = services.node_history(command.node, limit=10)
        return nodes_message(nodes, events, one=True)
    return nodes_message(nodes, [], strays=services.strays())


def borrowed(deps: SlackDeps, result: BorrowResult | Refused) -> Message:
    if isinstance(result, Refused):
        return refused_message(result)
    entry = None
    if result.outcome == Outcome.QUEUE:
        entries = deps.services.queue_explained()
        entry = next((e for e in entries if e.request.id == result.request.id), None)
    return borrow_reply(result, entry)


def _reply(result: Any, render: Any) -> Message:
    if isinstance(result, Refused):
        return refused_message(result)
    rendered: Message = render(result)
    return rendered


def _team_of(deps: SlackDeps, user: str) -> str | None:
    team = deps.services.policy.team_of(user)
    return team.name if team else None


def _admin(deps: SlackDeps, user: str, command: p.Admin) -> Message:
    services = deps.services
    if not services.policy.is_admin(user):
        return refused_message(Refused("`/gpu admin` is for gpubot admins.", "not-admin"))
    if command.action == "pause":
        answer = services.pause(user)
    elif command.action == "resume":
        answer = services.resume(user)
    elif command.action in ("drain", "undrain") and command.node:
        change = services.drain if command.action == "drain" else services.undrain
        answer = change(user, command.node, command.reason)
    elif command.action == "reload":
        answer = _reload(deps, user)
    else:
        return help_message("admin")
    if isinstance(answer, Refused):
        return refused_message(answer)
    return message(answer, [section(answer)])


def _reload(deps: SlackDeps, user: str) -> str | Refused:
    try:
        policy = deps.services.reload_rules_dir(user, deps.settings.rules_dir)
    except RulesDirError as exc:
        return Refused(f"Reload refused, the rules in force stay: {exc}", "reload")
    except PolicyError as exc:
        shown = "\n".join(f"• `{problem}`" for problem in exc.problems[:15])
        more = len(exc.problems) - 15
        tail = f"\n…and {more} more (`gpubot rules check` lists them all)." if more > 0 else ""
        return Refused(
            f"Reload refused, the rules in force stay ({deps.services.policy.revision}):\n"
            f"{shown}{tail}",
            "reload",
        )
    note = deps.services.simulation_note(policy.revision)
    return (
        f"Rules reloaded: revision {policy.revision}, {len(policy.rules)} rules, "
        f"{len(policy.cases)} cases passed." + (f"\n{note}" if note else "")
    )
