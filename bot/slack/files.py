"""A report's chart or CSV as the outbox shares it: the report built again for the person who
asked (who may no longer see it: then a plain message to them says so), drawn in their time
zone, and shared as a file in the conversation named in the row's `channel` (a person's id: their
DM with the bot); text bars where charts cannot be drawn. And, before a click is carried
out, whether the bot may share in the conversation it came from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, tzinfo
from typing import Any, cast

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError

from bot.services import Services, charts, reports
from bot.services.results import Refused
from bot.slack.blocks.kit import escape, message, section
from bot.slack.people import People
from bot.slack.sending import Rendered, Upload, shared_in
from rules.reports import GroupBy, Report, Scope, ScopeKind, Window, WindowError, parse_window
from storage.tables import OutboxRow


def report_file(services: Services, people: People, row: OutboxRow) -> Rendered:
    """What a REPORT_FILE row shares: the file, or a message when there is none to share."""
    data = row.data
    viewer = str(data["viewer"])
    scope = Scope(ScopeKind(str(data["scope"])), str(data.get("name") or ""))
    by = cast(GroupBy | None, data.get("by") or None)
    tz = people.zone(viewer).tz
    name = people.name(viewer)
    try:
        window = _window(data, services.now(), tz)
    except WindowError as exc:
        return _said(f"{escape(name)}, I did not share that report: {exc}")
    built = reports.build(services.ctx, viewer, scope, window, by=by, tz=tz)
    if isinstance(built, Refused):
        return _said(f"{escape(name)}, I did not share that report: {built.message}")
    about = _about(scope, viewer, people)
    fmt: charts.FileFormat = "csv" if data.get("format") == "csv" else "png"
    asked = str(data.get("window") or "")
    filename = charts.filename(scope, asked, fmt)
    title = charts.title(built, about, tz)
    if fmt == "csv":
        zone = getattr(tz, "key", None) or "UTC"
        content = charts.csv(built, names=_names(built, people), zone=zone).encode()
        comment = f"The figures of {title}, as CSV, for {name}."
        return Rendered(comment, [], upload=Upload(filename, f"{title} (CSV)", content, comment))
    drawn = charts.png(built, tz=tz, about=about)
    if drawn is None:  # the text bars go where the chart would have
        bars = f"{charts.NO_CHARTS}\n*{escape(title)}*\n```{charts.text_bars(built)}```"
        return replace(_said(bars), where=shared_in(row))
    comment = f"{title}, the chart {name} asked for."
    return Rendered(comment, [], upload=Upload(filename, title, drawn, comment))


def reachable(client: WebClient, channel: str, viewer: str) -> bool | None:
    """May the bot share a file in `channel`, where `viewer` clicked (conversations.info)?
    False for a channel it is not in, one it cannot see, an archived one or a DM with
    someone else; None when Slack did not say (the share then finds out)."""
    if not channel:
        return False
    try:
        info = client.conversations_info(channel=channel)["channel"]
    except SlackApiError as exc:
        return False if exc.response.get("error") in _HIDDEN else None
    except (SlackRequestError, OSError):
        return None
    if info.get("is_im"):
        return bool(info.get("user") == viewer)  # their DM with the bot
    if info.get("is_archived"):
        return False
    member = info.get("is_member")
    return member if isinstance(member, bool) else None


_HIDDEN = frozenset({"channel_not_found", "not_in_channel"})


def _window(data: Mapping[str, Any], now: datetime, tz: tzinfo) -> Window:
    """The window as asked for ("7d", "2026-11": read now, in the reader's zone), or the
    exact one a caller fixed (`since` and `until`)."""
    asked = str(data.get("window") or "")
    if data.get("since") and data.get("until"):
        since = datetime.fromisoformat(str(data["since"]))
        until = datetime.fromisoformat(str(data["until"]))
        return Window(since, until, str(data.get("label") or asked))
    return parse_window(asked, now, tz)


def _about(scope: Scope, viewer: str, people: People) -> str:
    """The report's subject in words, a person by their name. A `me` report is always the
    viewer's own, whatever name its row carries (the report read is theirs too)."""
    if scope.kind == ScopeKind.ME:
        return people.name(viewer)
    if scope.kind == ScopeKind.USER:
        return people.name(scope.name or viewer)
    return charts.label(scope)


def _names(report: Report, people: People) -> dict[str, str]:
    """People's names for a breakdown by person (the CSV keeps their ids next to them)."""
    if report.by != "holder":
        return {}
    return {line.key: people.name(line.key) for line in report.lines if line.key}


def _said(text: str) -> Rendered:
    built = message(text, [section(text)])
    blocks: list[dict[str, Any]] = list(built.blocks)
    return Rendered(built.text, blocks)
