"""Modals (a stack of at most three per person) and Home tabs (one per person), by V… id."""

from __future__ import annotations

import secrets
from copy import deepcopy

from .core import WorkspaceCore
from .model import JSON

MAX_STACK = 3


class Views:
    """The views the app opened, pushed, updated or published; guarded by the workspace lock."""

    def __init__(self, workspace: WorkspaceCore) -> None:
        self._ws = workspace
        self._views: dict[str, JSON] = {}
        self._owner: dict[str, str] = {}
        self._stacks: dict[str, list[str]] = {}  # person -> modal view ids, root first
        self._homes: dict[str, str] = {}

    def _store(self, owner: str, view_id: str, view: JSON, root: str, previous: str | None) -> JSON:
        ws = self._ws
        stored: JSON = {
            "id": view_id,
            "team_id": ws.team_id,
            "type": view.get("type"),
            "blocks": deepcopy(view.get("blocks", [])),
            "private_metadata": view.get("private_metadata", ""),
            "callback_id": view.get("callback_id", ""),
            "state": {"values": {}},
            "hash": f"{int(ws.now())}.{secrets.token_hex(4)}",
            "title": deepcopy(view.get("title")),
            "clear_on_close": bool(view.get("clear_on_close", False)),
            "notify_on_close": bool(view.get("notify_on_close", False)),
            "close": deepcopy(view.get("close")),
            "submit": deepcopy(view.get("submit")),
            "previous_view_id": previous,
            "root_view_id": root,
            "app_id": ws.app_id,
            "external_id": view.get("external_id", ""),
            "app_installed_team_id": ws.team_id,
            "bot_id": ws.bot_id,
        }
        self._views[view_id] = stored
        self._owner[view_id] = owner
        return deepcopy(stored)

    def open_modal(self, user: str, view: JSON) -> JSON:
        """A new modal for `user`, replacing any modal stack they had open."""
        with self._ws.lock:
            view_id = self._ws.next_id("V")
            self._stacks[user] = [view_id]
            return self._store(user, view_id, view, root=view_id, previous=None)

    def push_modal(self, user: str, view: JSON) -> JSON | None:
        """A modal on top of `user`'s stack, or None when three are already open."""
        with self._ws.lock:
            stack = self._stacks.setdefault(user, [])
            if len(stack) >= MAX_STACK:
                return None
            view_id = self._ws.next_id("V")
            root, previous = (stack[0], stack[-1]) if stack else (view_id, None)
            stack.append(view_id)
            return self._store(user, view_id, view, root=root, previous=previous)

    def update(self, view_id: str, view: JSON) -> JSON | None:
        """Replace an existing view's content; it keeps its id and place, and gets a new hash."""
        with self._ws.lock:
            old = self._views.get(view_id)
            if old is None:
                return None
            owner = self._owner[view_id]
            return self._store(owner, view_id, view, old["root_view_id"], old["previous_view_id"])

    def publish_home(self, user: str, view: JSON) -> JSON:
        """`user`'s Home tab; it keeps one id for life."""
        with self._ws.lock:
            view_id = self._homes.get(user) or self._ws.next_id("V")
            self._homes[user] = view_id
            return self._store(user, view_id, view, root=view_id, previous=None)

    def get(self, view_id: str) -> JSON | None:
        with self._ws.lock:
            return deepcopy(self._views.get(view_id))

    def by_external_id(self, external_id: str) -> JSON | None:
        with self._ws.lock:
            found = [v for v in self._views.values() if v["external_id"] == external_id]
            return deepcopy(found[0]) if found and external_id else None

    def owner(self, view_id: str) -> str | None:
        with self._ws.lock:
            return self._owner.get(view_id)

    def close(self, view_id: str) -> None:
        """Close a modal and whatever was pushed above it (what Slack does on submit or cancel)."""
        with self._ws.lock:
            stack = self._stacks.get(self._owner.get(view_id, ""), [])
            if view_id in stack:
                del stack[stack.index(view_id) :]

    def clear(self, user: str) -> None:
        """Close every modal `user` has open (response_action "clear")."""
        with self._ws.lock:
            self._stacks[user] = []

    def modals(self, user: str) -> list[JSON]:
        """`user`'s open modals, root first; the last is the one on screen."""
        with self._ws.lock:
            return [deepcopy(self._views[v]) for v in self._stacks.get(user, [])]

    def home(self, user: str) -> JSON | None:
        with self._ws.lock:
            view_id = self._homes.get(user)
            return deepcopy(self._views[view_id]) if view_id else None

    def homes(self) -> dict[str, JSON]:
        with self._ws.lock:
            return {user: deepcopy(self._views[v]) for user, v in self._homes.items()}
