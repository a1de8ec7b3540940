"""What every listener works with (`SlackDeps`): the use cases, people, settings and the inbox
that records a request before its ack.

Listeners import this module, and the app (bot.slack.app) builds it: neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slack_bolt import Ack

from bot.services import Refused, Services, reports
from bot.settings import Settings
from bot.slack import files
from bot.slack.blocks import BORROW_MODAL
from bot.slack.blocks.reports import REPORT_CHART_ACTION, REPORT_CSV_ACTION
from bot.slack.inbox import Accepted, Inbox, request_key
from bot.slack.parse import Audit, Report, Why, parse
from bot.slack.people import UTC_ZONE, People, Zone
from rules.reports import ScopeKind
from storage.tables import InboxRow

REPORT_FILE_ACTIONS = (REPORT_CHART_ACTION, REPORT_CSV_ACTION)
NOT_RECORDED = (
    ":warning: gpubot could not record your request just now (its database is not "
    "answering), so nothing was done. Please try again in a minute."
)


class NotRecorded(Exception):  # noqa: N818 - names the situation, like Slack's own error codes
    """A request that could not be recorded is refused (503), so Slack shows it failed."""


def own_team(services: Services, user: str) -> str | None:
    """The team a manager's report shows by default, else the team the person is in."""
    default = reports.default_scope(services.ctx, user)
    if default.kind is ScopeKind.TEAM:
        return default.name
    team = services.policy.team_of(user)
    return team.name if team is not None else None


@dataclass
class SlackDeps:
    """What listeners need: the use cases, people's names and zones, the inbox and settings."""

    services: Services
    people: People
    settings: Settings
    inbox: Inbox = field(init=False)

    def now(self) -> datetime:
        return self.services.now().astimezone(UTC)

    def accept(
        self,
        ack: Ack,
        body: dict[str, Any],
        *,
        kind: str,
        actor: str,
        payload: dict[str, Any],
    ) -> None:
        """Record the request, then ack: what is acked is carried out, exactly once."""
        accepted = self.inbox.accept(key=request_key(body), kind=kind, actor=actor, payload=payload)
        if accepted is not Accepted.UNAVAILABLE:
            ack()
        elif kind == "command":
            ack(text=NOT_RECORDED)  # the person reads this where they typed
        else:
            raise NotRecorded(kind)

    def look_up(self, row: InboxRow) -> Zone | bool | None:
        """What a request needs from Slack before its unit of work: the person's time zone,
        for an end time typed in a command or a form (a users.info call, cached); whether a
        report's file may be shared where its button was clicked (`may_share`)."""
        payload = row.payload
        if row.kind == "action" and payload.get("action_id") in REPORT_FILE_ACTIONS:
            return self.may_share(row)
        if row.kind == "command" and "until" in str(payload.get("text", "")).lower():
            return self.people.zone(row.actor)
        if row.kind == "command":
            return self._explaining(row.actor, str(payload.get("text", "")))
        if row.kind == "view" and payload.get("callback_id") == BORROW_MODAL:
            return self.people.zone(row.actor)
        return None

    def may_share(self, row: InboxRow) -> bool | None:
        """For a *Chart* or *CSV* click: may the bot share a file where it was clicked (a
        conversations.info call, before the unit of work)? None: Slack did not say."""
        where = str(row.payload.get("channel_id") or "")
        return files.reachable(self.people.client, where, row.actor)

    def _explaining(self, user: str, text: str) -> Zone | None:
        """`why` and `audit` show times in the reader's zone and people by name: both looked
        up here, outside the unit of work (a read, then users.info calls, cached)."""
        parsed = parse(text, now=self.now(), tz=UTC_ZONE, pools=list(self.services.policy.pools))
        if isinstance(parsed, Report):
            return self._reporting(user, parsed)
        if not isinstance(parsed, Why | Audit):
            return None
        zone = self.people.zone(user)
        ask = self.services.audit if isinstance(parsed, Audit) else self.services.why
        found = ask(user, parsed.ref, tz=zone.tz)
        if not isinstance(found, Refused):
            self.people.warm("\n".join((found.summary, *found.lines)))
        return zone

    def _reporting(self, user: str, command: Report) -> Zone:
        """`report` counts days in the reader's zone and shows a team's people by name: the
        zone, and the names of the team a manager's report breaks down, looked up here."""
        named = command.name if command.scope is ScopeKind.TEAM else ""
        team = self.services.policy.teams.get(named or own_team(self.services, user) or "")
        if team is not None:
            self.people.warm(" ".join(f"<@{who}>" for who in sorted(team.members | team.managers)))
        return self.people.zone(user)
