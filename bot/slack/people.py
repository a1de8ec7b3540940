"""Who people are in Slack: display names and time zones, from users.info, cached."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

log = logging.getLogger(__name__)
UTC_ZONE = ZoneInfo("UTC")
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")
_MENTION = re.compile(r"<@([UW][A-Z0-9]{2,})(?:\|[^>]*)?>")


def _display_name(info: Mapping[str, Any]) -> str:
    """What people are called: the display name they chose, unless it is only their handle,
    else their full name."""
    profile = info.get("profile") or {}
    display = str(profile.get("display_name") or "")
    if display and display != info.get("name"):
        return display
    real = profile.get("real_name") or info.get("real_name") or display or info.get("name")
    return str(real or "")


@dataclass(frozen=True)
class Zone:
    """A person's time zone, and whether Slack told it (else UTC is a guess to own up to)."""

    tz: ZoneInfo
    known: bool


class People:
    """Names and time zones, looked up once per person; Slack failing falls back, never raises."""

    def __init__(self, client: WebClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._known: dict[str, tuple[str, ZoneInfo]] = {}

    def _lookup(self, user: str) -> tuple[str, ZoneInfo]:
        with self._lock:
            if user in self._known:
                return self._known[user]
        try:
            info = self.client.users_info(user=user)["user"]
        except (SlackApiError, OSError) as exc:
            log.info("users.info %s failed (%s); using the id and UTC", user, exc)
            return user, UTC_ZONE  # not cached: the next look may work
        name = _display_name(info) or user
        try:
            zone = ZoneInfo(info.get("tz") or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            zone = UTC_ZONE
        with self._lock:
            self._known[user] = (str(name), zone)
        return str(name), zone

    def name(self, user: str) -> str:
        return self._lookup(user)[0]

    def label(self, who: str | None) -> str:
        """A person's name for a Slack user id; anything else (gpubot itself) as it is."""
        if not who:
            return "nobody"
        return self.name(who) if _USER_ID.fullmatch(who) else who

    def warm(self, text: str) -> None:
        """Look up everyone `text` mentions (users.info, cached), before a unit of work that
        shows their names with `known_names`."""
        for user in dict.fromkeys(m.group(1) for m in _MENTION.finditer(text)):
            self._lookup(user)

    def known_names(self, text: str) -> str:
        """`text` with each `<@U…>` mention of someone looked up before replaced by their
        name; never calls Slack (Slack itself shows the other mentions as names)."""

        def named(m: re.Match[str]) -> str:
            with self._lock:
                known = self._known.get(m.group(1))
            return known[0] if known is not None else m.group(0)

        return _MENTION.sub(named, text)

    def zone(self, user: str) -> Zone:
        """The person's zone from users.info (cached), or UTC marked as a guess when Slack
        could not be asked."""
        self._lookup(user)
        known = self.known_tz(user)
        return Zone(known, True) if known is not None else Zone(UTC_ZONE, False)

    def known_tz(self, user: str) -> ZoneInfo | None:
        """The zone if it was looked up before; never calls Slack (the ack path uses it)."""
        with self._lock:
            known = self._known.get(user)
        return known[1] if known is not None else None
