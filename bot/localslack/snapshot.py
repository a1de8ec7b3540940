"""The workspace as plain JSON for a UI: who is there, what each conversation shows, which views."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .workspace import Workspace


def snapshot(ws: Workspace) -> dict[str, Any]:
    """Everything a page needs to draw the workspace; call it under the workspace lock."""
    users = sorted(ws.users.values(), key=lambda user: user.id)
    return {
        "team": {"id": ws.team_id, "name": ws.team_name},
        "bot": {"user_id": ws.bot_user, "bot_id": ws.bot_id, "app_id": ws.app_id},
        "users": [asdict(user) for user in users],
        "channels": [
            {
                "id": channel.id,
                "name": channel.name,
                "is_private": channel.is_private,
                "is_im": channel.is_im,
                "im_user": channel.im_user,
                "members": sorted(channel.members),
                "messages": [asdict(message) for message in ws.messages(channel.id)],
            }
            for channel in sorted(ws.channels.values(), key=lambda channel: channel.id)
        ],
        "ephemerals": [asdict(ephemeral) for ephemeral in ws.ephemerals()],
        "homes": ws.views.homes(),
        "modals": {user.id: ws.views.modals(user.id) for user in users},
        "files": [file.as_json() for file in ws.files.values()],
    }
