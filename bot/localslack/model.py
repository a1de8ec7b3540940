"""The records a local Slack workspace keeps, each able to render itself in Slack's JSON shape."""

from __future__ import annotations

import mimetypes
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


@dataclass
class User:
    """A person (or the bot user) in the workspace."""

    id: str
    name: str
    real_name: str
    tz: str = "Europe/Berlin"
    tz_label: str = "Central European Time"
    tz_offset: int = 3600  # seconds east of UTC, as Slack reports it
    is_admin: bool = False
    is_bot: bool = False
    email: str = ""

    def as_json(self, team_id: str) -> JSON:
        """The `user` object of users.info."""
        return {
            "id": self.id,
            "team_id": team_id,
            "name": self.name,
            "deleted": False,
            "real_name": self.real_name,
            "tz": self.tz,
            "tz_label": self.tz_label,
            "tz_offset": self.tz_offset,
            "is_admin": self.is_admin,
            "is_owner": self.is_admin,
            "is_bot": self.is_bot,
            "profile": {
                "real_name": self.real_name,
                "display_name": self.name,
                "email": self.email,
                "image_48": "",
            },
        }


@dataclass
class Channel:
    """A public or private channel, or a DM (`im_user` set) between the bot and one person."""

    id: str
    name: str
    is_private: bool = False
    members: set[str] = field(default_factory=set)
    im_user: str | None = None

    @property
    def is_im(self) -> bool:
        return self.im_user is not None

    def as_json(self) -> JSON:
        if self.im_user is not None:
            return {"id": self.id, "is_im": True, "user": self.im_user, "is_open": True}
        return {
            "id": self.id,
            "name": self.name,
            "is_channel": not self.is_private,
            "is_group": self.is_private,
            "is_im": False,
            "is_private": self.is_private,
            "is_member": True,
        }


@dataclass
class Message:
    """A message everyone in the channel sees."""

    channel: str
    ts: str
    text: str
    blocks: list[JSON]
    user: str
    bot_id: str | None = None
    thread_ts: str | None = None
    reply_broadcast: bool = False  # a thread reply also shown in the channel
    edited: bool = False
    files: list[str] = field(default_factory=list)
    metadata: JSON | None = None  # Slack's message metadata: {event_type, event_payload}
    # A thread's parent: how many replies, the newest one's ts and who wrote them.
    reply_count: int = 0
    latest_reply: str | None = None
    reply_users: list[str] = field(default_factory=list)

    @property
    def is_reply(self) -> bool:
        """A message inside a thread (a parent's thread_ts is its own ts)."""
        return self.thread_ts is not None and self.thread_ts != self.ts

    def as_json(self, team_id: str, app_id: str) -> JSON:
        """The `message` object Slack returns and embeds in block_actions payloads."""
        body: JSON = {"type": "message", "text": self.text, "ts": self.ts, "user": self.user}
        if self.bot_id is not None:
            body |= {"subtype": "bot_message", "bot_id": self.bot_id, "app_id": app_id}
        if self.reply_broadcast:
            body["subtype"] = "thread_broadcast"
        body["team"] = team_id
        if self.blocks:
            body["blocks"] = self.blocks
        if self.thread_ts is not None:
            body["thread_ts"] = self.thread_ts
        if self.reply_count:
            body |= {
                "reply_count": self.reply_count,
                "reply_users_count": len(self.reply_users),
                "reply_users": list(self.reply_users),
                "latest_reply": self.latest_reply,
            }
        if self.edited:
            body["edited"] = {"user": self.user, "ts": self.ts}
        if self.files:
            body["files"] = [{"id": file_id} for file_id in self.files]
        if self.metadata is not None:
            body["metadata"] = self.metadata
        return body


@dataclass
class Ephemeral:
    """A message only `user` sees, in `channel`; it cannot be edited through chat.update."""

    channel: str
    user: str
    ts: str
    text: str
    blocks: list[JSON]
    thread_ts: str | None = None

    def as_json(self) -> JSON:
        body: JSON = {"type": "message", "text": self.text, "ts": self.ts, "user": self.user}
        if self.blocks:
            body["blocks"] = self.blocks
        return body


@dataclass
class File:
    """A file announced by files.getUploadURLExternal; `content` arrives on the upload URL."""

    id: str
    name: str
    length: int
    title: str = ""
    content: bytes | None = None
    channel: str | None = None
    completed: bool = False

    @property
    def mimetype(self) -> str:
        return mimetypes.guess_type(self.name)[0] or "application/octet-stream"

    def as_json(self, base_url: str = "") -> JSON:
        """Slack's file object; with the API's `base_url`, where its bytes are served (with the
        bot token, as Slack serves url_private)."""
        body: JSON = {
            "id": self.id,
            "name": self.name,
            "title": self.title or self.name,
            "mimetype": self.mimetype,
            "filetype": self.name.rpartition(".")[2].lower() if "." in self.name else "",
            "size": len(self.content or b""),
        }
        if base_url:
            body["url_private"] = body["url_private_download"] = self.path(base_url)
        return body

    def path(self, base: str = "/") -> str:
        """Where the bytes are served under `base`: BASE + files/ID/NAME."""
        return f"{base}files/{self.id}/{urllib.parse.quote(self.name)}"


@dataclass
class ResponseUrl:
    """A response_url token: where it was issued, for whom, and how often it was used."""

    token: str
    channel: str
    user: str
    source_ts: str | None  # the message (or ephemeral) a button sat on; None for a command
    source_ephemeral: bool
    created: float
    uses: int = 0
    last_ts: str | None = None  # the latest ephemeral posted through it (for replace_original)


@dataclass
class Trigger:
    """A trigger_id: valid for three seconds and once."""

    id: str
    user: str
    issued_at: float
    used: bool = False
