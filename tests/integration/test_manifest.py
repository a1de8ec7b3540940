"""deploy/slack-app-manifest.yaml matches the code: the command, the events, the interactivity,
the Home tab, and exactly the bot scopes the Web API methods the code calls need."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "slack-app-manifest.yaml"

# Slack's documented scope for each Web API method gpubot calls (views.* need none).
SCOPES = {
    "auth_test": set(),
    # The outbox looks a message up by its outbox id before posting it again after a crash.
    "conversations_history": {"channels:history", "groups:history", "im:history"},
    # ... and, for a reply in a lease's thread, in that thread.
    "conversations_replies": {"channels:history", "groups:history", "im:history"},
    "chat_postMessage": {"chat:write", "chat:write.public"},
    "chat_update": {"chat:write"},
    "conversations_open": {"im:write"},
    "users_info": {"users:read"},
    # `gpubot org lookup`: the ids org.yaml needs, by email or by handle or name.
    "users_lookupByEmail": {"users:read.email"},
    "users_list": {"users:read"},
    # A report's chart or CSV: the upload URL, the bytes, the share (files_upload_v2's steps).
    "files_getUploadURLExternal": {"files:write"},
    "files_completeUploadExternal": {"files:write"},
    # ... and whether gpubot is in the conversation where Chart or CSV was clicked.
    "conversations_info": {"channels:read", "groups:read", "im:read", "mpim:read"},
    "_upload_file": set(),  # the bytes go to the URL Slack handed out, which needs no scope
    "views_open": set(),
    "views_publish": set(),
}
CALL = re.compile(r"client\.([A-Za-z_]+)\(")
LISTENER = re.compile(r"@app\.(command|event)\(\"([^\"]+)\"\)")


def manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return loaded


def source(*packages: str) -> str:
    files = [p for package in packages for p in (ROOT / "bot" / package).rglob("*.py")]
    return "\n".join(p.read_text() for p in sorted(files))


def test_the_manifest_declares_exactly_the_scopes_the_code_needs() -> None:
    """Every Web API method called maps to its scopes; nothing more is asked for."""
    called = set(CALL.findall(source("slack", "cli")))  # the CLI asks Slack for people
    assert called <= SCOPES.keys(), f"add the scopes of {sorted(called - SCOPES.keys())}"
    needed = {"commands"}.union(*(SCOPES[m] for m in called))
    assert sorted(needed) == sorted(manifest()["oauth_config"]["scopes"]["bot"])


def test_the_manifest_declares_the_command_and_the_events_the_app_listens_to() -> None:
    """Slash commands and bot events in the manifest are the ones registered in code."""
    registered = LISTENER.findall(source("slack"))
    commands = {name for kind, name in registered if kind == "command"}
    events = {name for kind, name in registered if kind == "event"}
    m = manifest()
    assert commands == {c["command"] for c in m["features"]["slash_commands"]}
    assert events == set(m["settings"]["event_subscriptions"]["bot_events"])


def test_the_manifest_enables_buttons_the_home_tab_dms_and_socket_mode() -> None:
    """Interactivity for buttons and modals, the Home tab, the messages tab, Socket Mode."""
    m = manifest()
    assert m["settings"]["interactivity"]["is_enabled"]
    assert m["features"]["app_home"]["home_tab_enabled"]
    assert m["features"]["app_home"]["messages_tab_enabled"]
    assert m["settings"]["socket_mode_enabled"]
