"""What a person does on the page, turned into what Slack would send the bot: signed slash
commands, block_actions and view_submission payloads through `SlackDriver`, and the demo's own
fast-forward (started here, moved on a thread of its own). Each handler takes the page's JSON
body and answers JSON."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from bot.localslack import Reply
from bot.localslack.payloads import Source
from bot.workspace.demo import ForwardBusyError

if TYPE_CHECKING:
    from bot.workspace.demo import Demo

Body = dict[str, Any]
COMMAND = "/gpu"


class UiError(Exception):
    """A request the page cannot carry out; the message is shown to the person."""


def _person(demo: Demo, body: Body) -> str:
    person = str(body.get("as") or "")
    if demo.local.workspace.user(person) is None:
        raise UiError(f"nobody called {person!r} is in this workspace")
    return person


def _answered(reply: Reply, what: str) -> Body:
    """Slack's own words when an app does not answer in time or fails."""
    if reply.status == 0:
        raise UiError(f'{what} failed with the error "operation_timeout"')
    if reply.status != 200:
        raise UiError(f'{what} failed with the error "dispatch_failed" (HTTP {reply.status})')
    return {"ok": True}


def command(demo: Demo, body: Body) -> Body:
    """`/gpu …` as a signed slash command; other text is posted as the person's own message."""
    person, text = _person(demo, body), str(body.get("text") or "").strip()
    channel = demo.local.workspace.channel(str(body.get("channel") or ""))
    if channel is None or person not in channel.members:
        raise UiError("you are not in that conversation")
    if not text:
        raise UiError("type something first, e.g. /gpu help")
    word, _, rest = text.partition(" ")
    if not word.startswith("/"):
        safe = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        demo.local.workspace.post(channel.id, safe, user=person)
        return {"ok": True}
    if word != COMMAND:
        raise UiError(f"{word} is not a valid command here; gpubot answers {COMMAND}")
    reply = demo.slack.command(person, rest.strip(), channel=channel.id)
    return _answered(reply, COMMAND)


def _view(demo: Demo, person: str, view_id: object) -> Body:
    """A view (modal or Home tab) of this person's."""
    views = demo.local.workspace.views
    view = views.get(str(view_id or ""))
    if view is None or views.owner(str(view_id)) != person:
        raise UiError("that view is gone")
    return view


def _source(demo: Demo, person: str, where: Body) -> Source:
    """The message, ephemeral or view a person clicked in, if they can see it."""
    ws = demo.local.workspace
    kind = where.get("kind")
    if kind == "view":
        return _view(demo, person, where.get("view_id"))
    ts, channel = str(where.get("ts") or ""), ws.channel(str(where.get("channel") or ""))
    if kind == "ephemeral":
        ephemeral = ws.ephemeral(ts)
        if ephemeral is None or ephemeral.user != person:
            raise UiError("that message is gone")
        return ephemeral
    message = ws.message(channel.id, ts) if channel and person in channel.members else None
    if message is None:
        raise UiError("that message is gone")
    return message


def click(demo: Demo, body: Body) -> Body:
    """A button or a select in a message, an ephemeral, the Home tab or a modal."""
    person = _person(demo, body)
    source = _source(demo, person, dict(body.get("source") or {}))
    try:
        reply = demo.slack.click(
            person,
            source,
            str(body.get("action_id") or ""),
            body.get("value"),
            block_id=body.get("block_id") or None,
        )
    except LookupError as exc:
        raise UiError(str(exc)) from None
    return _answered(reply, "gpubot")


def submit(demo: Demo, body: Body) -> Body:
    """A modal's submit button; field errors come back for the page to show."""
    person = _person(demo, body)
    view = _view(demo, person, body.get("view_id"))
    values = {str(k): v for k, v in dict(body.get("values") or {}).items() if v not in (None, "")}
    try:
        reply = demo.slack.submit(person, view, values)
    except LookupError as exc:
        raise UiError(str(exc)) from None
    answer = _answered(reply, "gpubot")
    return answer | {"errors": reply.errors} if reply.response_action == "errors" else answer


def close(demo: Demo, body: Body) -> Body:
    """Cancel on a modal (the bot asks for no view_closed events)."""
    person = _person(demo, body)
    view = _view(demo, person, body.get("view_id"))
    demo.local.workspace.views.close(str(view["id"]))
    return {"ok": True}


def home(demo: Demo, body: Body) -> Body:
    """Opening the app's Home tab: an app_home_opened event the bot answers with views.publish."""
    return _answered(demo.slack.open_home(_person(demo, body)), "gpubot")


def forward(demo: Demo, body: Body) -> Body:
    minutes = body.get("minutes")
    if not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= 1440:
        raise UiError("fast-forward takes whole minutes, 1 to 1440")
    try:
        job = demo.forward_later(timedelta(minutes=minutes))
    except ForwardBusyError as exc:
        raise UiError(str(exc)) from None
    return {"ok": True, "job": job}


def leave(demo: Demo, body: Body) -> Body:
    """The page was loaded afresh, or switched from or to this person: their open modals close,
    as Slack closes a modal whose window went away."""
    demo.local.workspace.views.clear(_person(demo, body))
    return {"ok": True}


ROUTES: dict[str, Callable[[Demo, Body], Body]] = {
    "/ui/command": command,
    "/ui/action": click,
    "/ui/submit": submit,
    "/ui/close": close,
    "/ui/home": home,
    "/ui/forward": forward,
    "/ui/leave": leave,
}
