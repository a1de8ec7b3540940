"""How a request from Slack reaches the app: signed HTTP, in-process Bolt dispatch, Socket Mode."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from .model import JSON

if TYPE_CHECKING:
    from slack_bolt import App

    from .server import LocalSlack

Kind = Literal["command", "interactive", "event"]
ENVELOPES: dict[Kind, str] = {
    "command": "slash_commands",
    "interactive": "interactive",
    "event": "events_api",
}


@dataclass(frozen=True)
class Inbound:
    """One request from Slack: the payload, its raw (signed) body and the headers Slack sends."""

    kind: Kind
    payload: JSON
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Outcome:
    """The app's answer; status 0 means it gave none within the transport's timeout."""

    status: int
    body: str
    headers: dict[str, str]


class Transport(Protocol):
    def deliver(self, inbound: Inbound) -> Outcome: ...


class HttpTransport:
    """POSTs the signed bytes to the app's URL (e.g. http://127.0.0.1:PORT/slack/events)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url, self.timeout = url, timeout
        # No ProxyHandler from the environment: the app is on loopback.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def deliver(self, inbound: Inbound) -> Outcome:
        request = urllib.request.Request(  # noqa: S310  (the URL is the app under test)
            self.url, data=inbound.body, headers=inbound.headers, method="POST"
        )
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                body = response.read().decode()
                return Outcome(response.status, body, dict(response.headers))
        except urllib.error.HTTPError as error:
            with error:
                return Outcome(error.code, error.read().decode(), dict(error.headers))
        except TimeoutError:
            return Outcome(0, "", {})
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                return Outcome(0, "", {})
            raise


class InProcessTransport:
    """Hands the same bytes and headers to `app.dispatch`, as Bolt's own tests do."""

    def __init__(self, app: App) -> None:
        self.app = app

    def deliver(self, inbound: Inbound) -> Outcome:
        from bot.server import bolt_request  # noqa: PLC0415  (Bolt only when used)

        headers: dict[str, str | Sequence[str]] = {
            name.lower(): value for name, value in inbound.headers.items()
        }
        response = self.app.dispatch(bolt_request(inbound.body.decode(), headers=headers))
        answered = {name: values[0] for name, values in response.headers.items() if values}
        return Outcome(response.status, response.body, answered)


class SocketTransport:
    """Sends the payload as a Socket Mode envelope; the app's ack becomes a JSON body."""

    def __init__(self, local: LocalSlack, timeout: float = 5.0) -> None:
        self.local, self.timeout = local, timeout

    def deliver(self, inbound: Inbound) -> Outcome:
        try:
            ack = self.local.socket_send(ENVELOPES[inbound.kind], inbound.payload, self.timeout)
        except TimeoutError:
            return Outcome(0, "", {})
        if not ack:
            return Outcome(200, "", {})
        return Outcome(200, json.dumps(ack), {"Content-Type": "application/json"})
