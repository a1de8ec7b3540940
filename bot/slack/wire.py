"""What arrives at /slack/events, checked before Bolt sees it: the signature and its timestamp on
the raw bytes first, then the body's encoding and shape. Anything that fails is refused with a
reason (401 unsigned, 400 malformed), so nothing unauthenticated or malformed reaches Bolt or a
listener. A signed body is still checked field by field: only Slack can sign, but the bot's
answer to a body it cannot read is a 400, never a crash.

The shapes are those of what gpubot handles (the /gpu command, its buttons and forms, the Home
tab's event, Slack's URL and SSL checks); any other well-formed request is `Unhandled` (404, as
Bolt answers what no listener takes).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

MAX_SKEW_S = 300  # Slack's own rule: a request older than five minutes may be a replay
MAX_DEPTH = 32  # Slack's payloads nest a dozen levels at most
MAX_FIELDS = 200
# Places in a payload where Slack puts an object or an id, and Bolt looks for ids.
_REFS = ("enterprise", "team", "user", "channel", "container", "message", "previous_message")


@dataclass(frozen=True)
class Refusal:
    status: int  # 400 malformed, 401 not signed by Slack, 404 nothing here handles it
    reason: str  # a short code for the log and the counters


UNHANDLED = Refusal(404, "unhandled")


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float) -> Refusal | None:
    """Slack's v0 signature over the raw bytes, and a timestamp within five minutes."""
    stamp = headers.get("x-slack-request-timestamp", "")
    signature = headers.get("x-slack-signature", "")
    if not stamp and not signature:
        return Refusal(401, "unsigned")
    if not (stamp.isascii() and stamp.isdecimal() and len(stamp) <= 12):
        return Refusal(401, "bad timestamp")
    if abs(now - int(stamp)) > MAX_SKEW_S:
        return Refusal(401, "stale timestamp")
    if not (signature.isascii() and signature.startswith("v0=") and len(signature) == 67):
        return Refusal(401, "bad signature")
    base = b"v0:" + stamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return Refusal(401, "bad signature")
    return None


def check(body: bytes, content_type: str) -> str | Refusal:
    """The body as text if it has the shape of something gpubot handles, else why not."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return Refusal(400, "not utf-8")
    # Bolt reads a body as JSON by its content type or its first character: so does this.
    is_json = content_type.split(";", maxsplit=1)[0].strip().lower() == "application/json"
    if is_json or text.startswith("{"):
        parsed = _json(text)
        if not isinstance(parsed, dict):
            return Refusal(400, "malformed json")
        return _event(parsed) or text
    try:
        form = dict(parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FIELDS))
    except ValueError:
        return Refusal(400, "malformed form")
    if "payload" in form:
        if "command" in form:
            return Refusal(400, "not a command")  # Bolt would read it as an interaction
        payload = _json(form["payload"])
        if not isinstance(payload, dict):
            return Refusal(400, "not an interaction")
        return _interaction(payload) or text
    if "command" in form:
        return text if _command_ok(form) else Refusal(400, "not a command")
    if form.get("ssl_check") == "1" and set(form) <= {"ssl_check", "token"}:
        return text
    return Refusal(400, "unknown request")


def _json(text: str) -> Any:
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return parsed if _depth(parsed) <= MAX_DEPTH else None


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def _slack_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 32 and value.isascii() and value.isalnum()


def _text(value: Any, limit: int = 4000) -> bool:
    return isinstance(value, str) and len(value) <= limit


def _maybe(value: Any, limit: int = 4000) -> bool:
    return value is None or _text(value, limit)


def _url(value: Any) -> bool:
    """A response_url: empty, or an http(s) address (Slack's are https://hooks.slack.com/…)."""
    if value is None or value == "":
        return True
    return _text(value, 1000) and value.startswith(("https://", "http://"))


def _refs_ok(payload: Mapping[str, Any]) -> bool:
    """The id-bearing fields are each absent, an id, or an object whose ids are text."""
    for key in _REFS:
        value = payload.get(key)
        if value is None or _text(value, 200):
            continue
        if not isinstance(value, dict):
            return False
        if not all(_maybe(value.get(k), 200) for k in ("id", "team_id", "enterprise_id")):
            return False
        if not all(_maybe(value.get(k), 200) for k in ("user_id", "channel_id", "ts")):
            return False
        nested = value.get("user")
        if nested is not None and not _text(nested, 200) and not isinstance(nested, dict):
            return False
    authorizations = payload.get("authorizations")
    if authorizations is not None and not (
        isinstance(authorizations, list)
        and all(isinstance(a, dict) and _refs_ok(a) for a in authorizations)
        and all(_maybe(a.get("enterprise_id"), 200) for a in authorizations)
    ):
        return False
    return all(
        payload.get(k) is None or isinstance(payload.get(k), bool | str)
        for k in ("is_enterprise_install", "is_ext_shared_channel")
    ) and all(_maybe(payload.get(k), 200) for k in ("team_id", "enterprise_id", "thread_ts"))


def _command_ok(form: Mapping[str, str]) -> bool:
    return (
        _text(form.get("command"), 64)
        and _slack_id(form.get("user_id"))
        and _text(form.get("text", ""))
        and _url(form.get("response_url"))
        and _text(form.get("trigger_id", ""), 200)
    )


def _interaction(payload: Mapping[str, Any]) -> Refusal | None:
    kind = payload.get("type")
    if not isinstance(kind, str):
        return Refusal(400, "not an interaction")
    if kind not in ("block_actions", "view_submission"):
        return UNHANDLED
    user = payload.get("user")
    if not isinstance(user, dict) or not _slack_id(user.get("id")) or not _refs_ok(payload):
        return Refusal(400, "not an interaction")
    if not (_url(payload.get("response_url")) and _maybe(payload.get("trigger_id"), 200)):
        return Refusal(400, "not an interaction")
    urls = payload.get("response_urls", [])
    if not (isinstance(urls, list) and all(_url_entry(u) for u in urls)):
        return Refusal(400, "not an interaction")
    if payload.get("function_data") is not None:
        return UNHANDLED  # a workflow step: nothing of gpubot's
    view = payload.get("view")
    if view is not None and not _view_ok(view):
        return Refusal(400, "not an interaction")
    if kind == "view_submission":
        return None if view is not None else Refusal(400, "not an interaction")
    actions = payload.get("actions")
    if not (
        isinstance(actions, list) and 0 < len(actions) <= 25 and all(_action_ok(a) for a in actions)
    ):
        return Refusal(400, "not an interaction")
    return None


def _url_entry(entry: Any) -> bool:
    """One of a modal's response_urls (its form asked for a channel to answer in)."""
    return isinstance(entry, dict) and _url(entry.get("response_url"))


def _action_ok(action: Any) -> bool:
    return (
        isinstance(action, dict)
        and _text(action.get("action_id"), 255)
        and _maybe(action.get("value"), 2000)
        and _maybe(action.get("block_id"), 255)
        and _maybe(action.get("type"), 64)
    )


def _view_ok(view: Any) -> bool:
    if not isinstance(view, dict):
        return False
    if not (_text(view.get("type"), 64) and _maybe(view.get("callback_id"), 255)):
        return False
    if not all(_maybe(view.get(k), 3000) for k in ("id", "private_metadata", "team_id", "hash")):
        return False
    if not _maybe(view.get("app_installed_team_id"), 200):
        return False
    state = view.get("state", {})
    if not isinstance(state, dict):
        return False
    values = state.get("values", {})
    return isinstance(values, dict) and all(
        isinstance(block, dict) and all(isinstance(v, dict) for v in block.values())
        for block in values.values()
    )


def _event(payload: Mapping[str, Any]) -> Refusal | None:
    kind = payload.get("type")
    if kind == "url_verification":
        return None if _text(payload.get("challenge"), 200) else Refusal(400, "not an event")
    if kind != "event_callback":
        return UNHANDLED if isinstance(kind, str) else Refusal(400, "not an event")
    event = payload.get("event")
    if not (isinstance(event, dict) and _text(payload.get("event_id", ""), 96)):
        return Refusal(400, "not an event")
    if not (_refs_ok(payload) and _refs_ok(event)):
        return Refusal(400, "not an event")
    if event.get("type") != "app_home_opened":
        return UNHANDLED
    if not (_slack_id(event.get("user")) and _maybe(event.get("tab"), 64)):
        return Refusal(400, "not an event")
    return None
