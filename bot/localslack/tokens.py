"""The short-lived tokens Slack hands an app with an interaction: response_urls and trigger_ids."""

from __future__ import annotations

import secrets
from copy import deepcopy

from .core import WorkspaceCore
from .model import ResponseUrl, Trigger

TRIGGER_TTL_S = 3.0
RESPONSE_URL_TTL_S = 30 * 60.0
RESPONSE_URL_USES = 5


class Tokens:
    """Issues and redeems tokens by the workspace clock, under the workspace lock."""

    def __init__(self, workspace: WorkspaceCore) -> None:
        self._ws = workspace
        self.response_urls: dict[str, ResponseUrl] = {}
        self.triggers: dict[str, Trigger] = {}

    def issue_response_url(
        self, channel: str, user: str, source_ts: str | None = None, *, ephemeral: bool = False
    ) -> str:
        """A fresh response_url token; `source_ts` is the message a clicked button sat on."""
        with self._ws.lock:
            token = f"{self._ws.next_id('R')}-{secrets.token_hex(6)}"
            self.response_urls[token] = ResponseUrl(
                token, channel, user, source_ts, ephemeral, created=self._ws.now()
            )
            return token

    def response_url(self, token: str) -> ResponseUrl | None:
        with self._ws.lock:
            return deepcopy(self.response_urls.get(token))

    def use_response_url(self, token: str) -> ResponseUrl | None:
        """The token, its use counted, if it is known, under five uses and under 30 minutes old."""
        with self._ws.lock:
            url = self.response_urls.get(token)
            if url is None or url.uses >= RESPONSE_URL_USES:
                return None
            if self._ws.now() - url.created > RESPONSE_URL_TTL_S:
                return None
            url.uses += 1
            return deepcopy(url)

    def note_response(self, token: str, ts: str | None) -> None:
        """Remember the latest ephemeral answer, which a later replace_original replaces."""
        with self._ws.lock:
            if token in self.response_urls:
                self.response_urls[token].last_ts = ts

    def issue_trigger(self, user: str) -> str:
        with self._ws.lock:
            serial = self._ws.next_id("")
            trigger_id = f"{int(self._ws.now())}.{int(serial)}.{secrets.token_hex(8)}"
            self.triggers[trigger_id] = Trigger(trigger_id, user, issued_at=self._ws.now())
            return trigger_id

    def redeem_trigger(self, trigger_id: str) -> Trigger | None:
        """The trigger, now used, if it exists, was never used and is at most three seconds old."""
        with self._ws.lock:
            trigger = self.triggers.get(trigger_id)
            if trigger is None or trigger.used:
                return None
            if self._ws.now() - trigger.issued_at > TRIGGER_TTL_S:
                return None
            trigger.used = True
            return deepcopy(trigger)
