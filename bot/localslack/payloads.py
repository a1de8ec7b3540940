"""What Slack sends an app, in Slack's exact shapes: slash commands, block actions, view
submissions, events. `fresh_response_url` / `fresh_trigger_id` register the tokens they carry.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .directory import APP_ID, BOT_USER, TEAM_ID
from .elements import action_payload, state_values
from .model import JSON, Ephemeral, Message

if TYPE_CHECKING:
    from .server import LocalSlack

LEGACY_TOKEN = "local-verification-token"  # noqa: S105  (Slack's deprecated field; never checked)
TEAM_DOMAIN = "gpubot-local"
Source = Message | Ephemeral | JSON  # a message, an ephemeral, or a view (modal or Home tab)


def fresh_response_url(
    local: LocalSlack,
    channel: str,
    user: str,
    source_ts: str | None = None,
    *,
    ephemeral: bool = False,
) -> str:
    """A new response_url on `local` for `user` in `channel` (`source_ts`: the clicked message)."""
    token = local.workspace.tokens.issue_response_url(channel, user, source_ts, ephemeral=ephemeral)
    return local.response_url(token)


def fresh_trigger_id(local: LocalSlack, user: str) -> str:
    return local.workspace.tokens.issue_trigger(user)


def _user(user: str, name: str | None) -> JSON:
    return {"id": user, "username": name or user, "name": name or user, "team_id": TEAM_ID}


def slash_command(
    user: str,
    text: str,
    channel: str = "C0GPU",
    command: str = "/gpu",
    *,
    response_url: str,
    trigger_id: str,
    user_name: str | None = None,
    channel_name: str | None = None,
) -> dict[str, str]:
    """The form fields of a slash command POST."""
    return {
        "token": LEGACY_TOKEN,
        "team_id": TEAM_ID,
        "team_domain": TEAM_DOMAIN,
        "channel_id": channel,
        "channel_name": channel_name or ("directmessage" if channel[0] == "D" else channel),
        "user_id": user,
        "user_name": user_name or user,
        "command": command,
        "text": text,
        "api_app_id": APP_ID,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id,
    }


def block_actions(
    user: str,
    action: JSON,
    source: Source,
    *,
    trigger_id: str,
    response_url: str | None = None,
    user_name: str | None = None,
    channel_name: str | None = None,
) -> JSON:
    """A click (or select) on `source`; `action` as from `elements.action_payload`."""
    payload: JSON = {
        "type": "block_actions",
        "user": _user(user, user_name),
        "api_app_id": APP_ID,
        "token": LEGACY_TOKEN,
        "trigger_id": trigger_id,
        "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
        "enterprise": None,
        "is_enterprise_install": False,
        "state": {"values": {}},
        "actions": [action],
    }
    if isinstance(source, Message | Ephemeral):
        payload["container"] = {
            "type": "message",
            "message_ts": source.ts,
            "channel_id": source.channel,
            "is_ephemeral": isinstance(source, Ephemeral),
        }
        payload["channel"] = {"id": source.channel, "name": channel_name or source.channel}
        if isinstance(source, Message):
            payload["message"] = source.as_json(TEAM_ID, APP_ID)
    else:
        payload["container"] = {"type": "view", "view_id": source["id"]}
        payload["view"] = source
        payload["state"] = source.get("state", {"values": {}})
    if response_url is not None:
        payload["response_url"] = response_url
    return payload


def view_submission(
    user: str,
    view: JSON,
    values: Mapping[str, Any],
    *,
    trigger_id: str,
    user_name: str | None = None,
) -> JSON:
    """Submitting a modal; `values` by action_id, shaped per element into state.values."""
    submitted = {**view, "state": {"values": state_values(view.get("blocks", []), values)}}
    return {
        "type": "view_submission",
        "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
        "user": _user(user, user_name),
        "api_app_id": APP_ID,
        "token": LEGACY_TOKEN,
        "trigger_id": trigger_id,
        "view": submitted,
        "response_urls": [],
        "is_enterprise_install": False,
        "enterprise": None,
    }


def event_callback(event: JSON, *, event_id: str | None = None) -> JSON:
    """An Events API envelope around `event`."""
    return {
        "token": LEGACY_TOKEN,
        "team_id": TEAM_ID,
        "api_app_id": APP_ID,
        "type": "event_callback",
        "event_id": event_id or "Ev" + uuid.uuid4().hex[:10].upper(),
        "event_time": int(time.time()),
        "event": event,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": TEAM_ID,
                "user_id": BOT_USER,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
    }


def app_home_opened(
    user: str, *, channel: str, view: JSON | None = None, event_id: str | None = None
) -> JSON:
    """`user` opened the app's Home tab; `view` is their published Home view, if any."""
    event: JSON = {
        "type": "app_home_opened",
        "user": user,
        "channel": channel,
        "tab": "home",
        "event_ts": f"{time.time():.6f}",
    }
    if view is not None:
        event["view"] = view
    return event_callback(event, event_id=event_id)


def url_verification(challenge: str) -> JSON:
    return {"token": LEGACY_TOKEN, "challenge": challenge, "type": "url_verification"}


__all__ = [
    "Source",
    "action_payload",
    "app_home_opened",
    "block_actions",
    "event_callback",
    "fresh_response_url",
    "fresh_trigger_id",
    "slash_command",
    "url_verification",
    "view_submission",
]
