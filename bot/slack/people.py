"""Who people are in Slack: display names and time zones, from users.info, cached."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

log = logging.getLogger(__name__)
UTC_ZONE = ZoneInfo("UTC")


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
        profile = info.get("profile") or {}
        name = profile.get("display_name") or info.get("real_name") or info.get("name") or user
        try:
            zone = ZoneInfo(info.get("tz") or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            zone = UTC_ZONE
        with self._lock:
            self._known[user] = (str(name), zone)
        return str(name), zone

    def name(self, user: str) -> str:
        return self._lookup(user)[0]

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
