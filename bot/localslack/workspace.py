"""The stateful local workspace: people, conversations, messages and files, behind one lock.

Tokens and views hang off it (`tokens.py`, `surfaces.py`); every record a caller gets is a copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from copy import deepcopy
from dataclasses import asdict
from typing import Any

from .directory import APP_ID, BOT_ID, BOT_USER, TEAM_ID, TEAM_NAME
from .directory import channels as default_channels
from .directory import people as default_people
from .model import JSON, Channel, Ephemeral, File, Message, User
from .surfaces import Views
from .tokens import Tokens


class Workspace:
    """One Slack team with its bot; `reset()` goes back to the people and channels it began with."""

    def __init__(
        self,
        users: Iterable[User],
        channels: Iterable[Channel],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.team_id, self.team_name = TEAM_ID, TEAM_NAME
        self.bot_user, self.bot_id, self.app_id = (
            BOT_USER,
            BOT_ID,
            APP_ID,
        )
        self._seed_users = list(users)
        self._seed_channels = list(channels)
        self.reset()

    @classmethod
    def default(cls, *, clock: Callable[[], float] = time.time) -> Workspace:
        """Ada, the managers and engineers of org.yaml, #gpu and the two approvals channels."""
        return cls(default_people(), default_channels(), clock=clock)

    def reset(self) -> None:
        """Forget messages, DMs, views, files and tokens; restore the seeded people and channels."""
        with self.lock:
            self.users = {user.id: deepcopy(user) for user in self._seed_users}
            self.channels = {channel.id: deepcopy(channel) for channel in self._seed_channels}
            self._messages: dict[str, list[Message]] = {}
            self._ephemerals: list[Ephemeral] = []
            self.files: dict[str, File] = {}
            self.tokens = Tokens(self)
            self.views = Views(self)
            self._last_ts_us = 0
            self._serial = 0

    def now(self) -> float:
        return self.clock()

    def next_ts(self) -> str:
        """A message ts ("<10 digits>.<6 digits>"), increasing across the workspace."""
        with self.lock:
            self._last_ts_us = max(int(self.now() * 1_000_000), self._last_ts_us + 1)
            seconds, micros = divmod(self._last_ts_us, 1_000_000)
            return f"{seconds:010d}.{micros:06d}"

    def next_id(self, prefix: str) -> str:
        with self.lock:
            self._serial += 1
            return f"{prefix}0{self._serial:08d}"

    # people and conversations

    def user(self, user_id: str) -> User | None:
        with self.lock:
            return deepcopy(self.users.get(user_id))

    def user_by_email(self, email: str) -> User | None:
        with self.lock:
            found = [user for user in self.users.values() if user.email == email.lower()]
            return deepcopy(found[0]) if found else None

    def everyone(self) -> list[User]:
        """Every user, by id: the order users.list pages through."""
        with self.lock:
            return [deepcopy(self.users[user_id]) for user_id in sorted(self.users)]

    def add_user(self, user: User) -> None:
        with self.lock:
            self.users[user.id] = deepcopy(user)

    def add_channel(self, channel: Channel) -> None:
        with self.lock:
            self.channels[channel.id] = deepcopy(channel)

    def channel(self, ref: str) -> Channel | None:
        """A channel by id, by name (with or without '#'), or a person's DM by their user id."""
        with self.lock:
            if ref in self.users:
                return deepcopy(self.channels[self.dm_channel(ref)])
            if ref in self.channels:
                return deepcopy(self.channels[ref])
            named = [c for c in self.channels.values() if c.name == ref.removeprefix("#")]
            return deepcopy(named[0]) if named else None

    def dm_channel(self, user_id: str) -> str:
        """The id of the bot's DM with `user_id`, opened on first use (D + the user id's tail)."""
        with self.lock:
            for channel in self.channels.values():
                if channel.im_user == user_id:
                    return channel.id
            dm = Channel(id="D" + user_id[1:], name=user_id, is_private=True, im_user=user_id)
            dm.members = {user_id, self.bot_user}
            self.channels[dm.id] = dm
            return dm.id

    def group_dm(self, user_ids: list[str]) -> str:
        """A group DM of the bot and `user_ids`, opened on first use."""
        with self.lock:
            members = {*user_ids, self.bot_user}
            for channel in self.channels.values():
                if channel.is_private and channel.members == members and channel.id[0] == "G":
                    return channel.id
            group = Channel(id=self.next_id("G"), name="mpdm", is_private=True, members=members)
            self.channels[group.id] = group
            return group.id

    # messages

    def post(
        self,
        channel: str,
        text: str,
        blocks: list[JSON] | None = None,
        *,
        user: str | None = None,
        thread_ts: str | None = None,
        files: Iterable[str] = (),
        metadata: JSON | None = None,
        reply_broadcast: bool = False,
    ) -> Message:
        """A new message in `channel` (an id), from the bot unless `user` is given; with
        `thread_ts`, a reply in the thread of that message (LookupError: there is no such
        message), which `reply_broadcast` also shows in the conversation."""
        with self.lock:
            parent = self._parent(channel, thread_ts) if thread_ts else None
            if thread_ts and parent is None:
                raise LookupError(f"no message {thread_ts} in {channel}")
            message = Message(
                channel=channel,
                ts=self.next_ts(),
                text=text,
                blocks=deepcopy(blocks or []),
                user=user or self.bot_user,
                bot_id=None if user else self.bot_id,
                thread_ts=parent.ts if parent is not None else None,
                files=list(files),
                metadata=deepcopy(metadata) if metadata else None,
                reply_broadcast=bool(reply_broadcast and parent is not None),
            )
            if parent is not None:
                parent.thread_ts = parent.ts
                parent.reply_count += 1
                parent.latest_reply = message.ts
                if message.user not in parent.reply_users:
                    parent.reply_users.append(message.user)
            self._messages.setdefault(channel, []).append(message)
            return deepcopy(message)

    def _parent(self, channel: str, thread_ts: str) -> Message | None:
        """The thread's parent: the message `thread_ts` names, or the parent of that reply."""
        found = [m for m in self._messages.get(channel, []) if m.ts == thread_ts]
        if not found:
            return None
        if found[0].is_reply:
            assert found[0].thread_ts is not None
            return self._parent(channel, found[0].thread_ts)
        return found[0]

    def replies(self, channel: str, ts: str) -> list[Message] | None:
        """A thread: its parent, then its replies, oldest first (None: no such message)."""
        with self.lock:
            parent = self._parent(channel, ts)
            if parent is None:
                return None
            replies = [m for m in self._messages.get(channel, []) if m.is_reply]
            return deepcopy([parent] + [m for m in replies if m.thread_ts == parent.ts])

    def message(self, channel: str, ts: str) -> Message | None:
        with self.lock:
            found = [m for m in self._messages.get(channel, []) if m.ts == ts]
            return deepcopy(found[0]) if found else None

    def update(
        self, channel: str, ts: str, text: str | None, blocks: list[JSON] | None, *, edited: bool
    ) -> Message | None:
        """Replace a message's text and/or blocks (None keeps the old value)."""
        with self.lock:
            for message in self._messages.get(channel, []):
                if message.ts == ts:
                    if text is not None:
                        message.text = text
                    if blocks is not None:
                        message.blocks = deepcopy(blocks)
                    message.edited = message.edited or edited
                    return deepcopy(message)
            return None

    def delete(self, channel: str, ts: str) -> bool:
        with self.lock:
            kept = [m for m in self._messages.get(channel, []) if m.ts != ts]
            deleted = len(kept) != len(self._messages.get(channel, []))
            self._messages[channel] = kept
            return deleted

    def messages(self, channel: str) -> list[Message]:
        with self.lock:
            return deepcopy(self._messages.get(channel, []))

    def post_ephemeral(
        self,
        channel: str,
        user: str,
        text: str,
        blocks: list[JSON] | None = None,
        thread_ts: str | None = None,
    ) -> Ephemeral:
        with self.lock:
            ephemeral = Ephemeral(channel, user, self.next_ts(), text, deepcopy(blocks or []))
            ephemeral.thread_ts = thread_ts
            self._ephemerals.append(ephemeral)
            return deepcopy(ephemeral)

    def ephemeral(self, ts: str) -> Ephemeral | None:
        with self.lock:
            found = [e for e in self._ephemerals if e.ts == ts]
            return deepcopy(found[0]) if found else None

    def replace_ephemeral(self, ts: str, text: str, blocks: list[JSON]) -> bool:
        with self.lock:
            for ephemeral in self._ephemerals:
                if ephemeral.ts == ts:
                    ephemeral.text, ephemeral.blocks = text, deepcopy(blocks)
                    return True
            return False

    def delete_ephemeral(self, ts: str) -> bool:
        with self.lock:
            kept = [e for e in self._ephemerals if e.ts != ts]
            deleted = len(kept) != len(self._ephemerals)
            self._ephemerals = kept
            return deleted

    def ephemerals(self, user: str | None = None, channel: str | None = None) -> list[Ephemeral]:
        """Ephemeral messages, oldest first, for one person and/or one channel (None: any)."""
        with self.lock:
            mine = [e for e in self._ephemerals if user is None or e.user == user]
            return deepcopy([e for e in mine if channel is None or e.channel == channel])

    # files

    def new_file(self, name: str, length: int) -> File:
        with self.lock:
            file = File(id=self.next_id("F"), name=name, length=length)
            self.files[file.id] = file
            return deepcopy(file)

    def file(self, file_id: str) -> File | None:
        with self.lock:
            file = self.files.get(file_id)
            return deepcopy(file) if file is not None else None

    def store_upload(self, file_id: str, content: bytes) -> bool:
        with self.lock:
            file = self.files.get(file_id)
            if file is None:
                return False
            file.content = content
            return True

    def complete_file(self, file_id: str, title: str, channel: str | None) -> File | None:
        """Mark an uploaded file shared (in `channel`, if given); None if it never arrived."""
        with self.lock:
            file = self.files.get(file_id)
            if file is None or file.content is None:
                return None
            file.title, file.channel, file.completed = title or file.name, channel, True
            return deepcopy(file)

    def snapshot(self) -> dict[str, Any]:
        """Plain JSON-able state for a UI: people, conversations, messages, views, files."""
        with self.lock:
            users = sorted(self.users.values(), key=lambda user: user.id)
            return {
                "team": {"id": self.team_id, "name": self.team_name},
                "bot": {"user_id": self.bot_user, "bot_id": self.bot_id, "app_id": self.app_id},
                "users": [asdict(user) for user in users],
                "channels": [
                    {
                        "id": channel.id,
                        "name": channel.name,
                        "is_private": channel.is_private,
                        "is_im": channel.is_im,
                        "im_user": channel.im_user,
                        "members": sorted(channel.members),
                        "messages": [asdict(message) for message in self.messages(channel.id)],
                    }
                    for channel in sorted(self.channels.values(), key=lambda channel: channel.id)
                ],
                "ephemerals": [asdict(ephemeral) for ephemeral in self.ephemerals()],
                "homes": self.views.homes(),
                "modals": {user.id: self.views.modals(user.id) for user in users},
                "files": [file.as_json() for file in self.files.values()],
            }
