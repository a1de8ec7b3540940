"""The Bolt app, built in a function (never at import), with every listener registered.

`build_app(settings, services, ...)` is used alike by `gpubot serve` (Socket Mode or HTTP),
the tests (signed requests against the local Slack API) and the local workspace demo. Each
listener answers at once what needs no decision (help, a typo, a form's field errors); anything
else is recorded in the inbox, acked, and carried out by the inbox's workers (bot.slack.inbox).
Nothing before an ack calls Slack, not even auth.test: the bot's identity is checked in the
background (`Identity`) and requests are authorized from it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from slack_bolt import App, BoltResponse
from slack_bolt.authorization import AuthorizeResult
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from bot.services import Services
from bot.settings import Settings
from bot.slack.deps import NotRecorded, SlackDeps
from bot.slack.inbox import Inbox
from bot.slack.listeners import actions, commands, events, submissions
from bot.slack.people import People

log = logging.getLogger(__name__)

#: auth.test answers that no retry will mend: the token itself is wrong.
BAD_TOKEN = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked"})


def web_client(settings: Settings) -> WebClient:
    """The Web API client: SLACK_API_URL, and retries on rate limits, 5xx and broken links."""
    token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
    return WebClient(
        token=token,
        base_url=settings.slack_api_url,
        timeout=10,
        retry_handlers=[
            ConnectionErrorRetryHandler(max_retry_count=2),
            RateLimitErrorRetryHandler(max_retry_count=3),
            ServerErrorRetryHandler(max_retry_count=2),
        ],
    )


class Identity:
    """Who the bot is in Slack (auth.test), learnt in the background with backoff so the bot
    starts and acks while Slack is down; requests are authorized from what is known so far."""

    def __init__(self, client: WebClient) -> None:
        self.client = client
        self.team_id: str | None = None
        self.user_id: str | None = None
        self.bot_id: str | None = None
        self.checked = threading.Event()
        self._stop = threading.Event()
        self.rejected: str | None = None  # Slack's error when it refused the token itself

    def check(self, *, quick: bool = False) -> str | None:
        """One auth.test: None when the identity is known, else what went wrong (`rejected`
        is set when no retry can mend it). `quick`: no retries and a short timeout (start-up
        does not wait for a Slack that is down)."""
        client = self.client
        if quick:
            client = WebClient(
                token=client.token, base_url=client.base_url, timeout=5, retry_handlers=[]
            )
        try:
            answer = client.auth_test()
        except SlackApiError as exc:
            error = str(exc.response.get("error", "?"))
            if error in BAD_TOKEN:
                self.rejected = error
            return f"Slack answered {exc.response.status_code} ({error})"
        except (SlackRequestError, OSError) as exc:
            return f"Slack cannot be reached ({type(exc).__name__}: {exc})"
        self.team_id = answer.get("team_id")
        self.user_id = answer.get("user_id")
        self.bot_id = answer.get("bot_id")
        self.checked.set()
        return None

    def keep_checking(self, first_wait_s: float = 2.0, longest_wait_s: float = 300.0) -> None:
        """Retry auth.test in a thread until it works (2 s, 4 s ... at most 5 minutes)."""

        def run() -> None:
            wait = first_wait_s
            while not self.checked.is_set() and not self._stop.wait(wait):
                problem = self.check()
                if problem is None:
                    log.info("Slack answers again: the bot is %s", self.user_id)
                    return
                log.warning("auth.test: %s; retrying in %.0f s", problem, wait)
                wait = min(wait * 2, longest_wait_s)

        if not self.checked.is_set():
            threading.Thread(target=run, name="gpubot-auth-test", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def authorize(self, token: str | None, enterprise_id: str | None, team_id: str | None) -> Any:
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id or self.team_id,
            bot_token=token,
            bot_user_id=self.user_id,
            bot_id=self.bot_id,
        )


class _QuietBolt(logging.Filter):
    """Bolt warns that the token it read from the environment is unused, since our client (built
    from that same token) and our authorize win; and it writes eight lines of coding advice for
    every request no listener takes. Neither helps an operator: the front counts and logs
    unhandled requests itself (bot.server), once a minute."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (
            "`token` will be unused" in text
            or "will be ignored" in text
            or text.startswith("Unhandled request")
        )


class _QuietSdk(logging.Filter):
    """slack_sdk logs an ERROR for each call that fails to connect; the outbox, which retries
    them, says so itself in one line a pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to send a request to Slack API server")


_quiet = _QuietBolt()
_quiet_sdk = _QuietSdk()


def build_app(
    settings: Settings,
    services: Services,
    *,
    client: WebClient | None = None,
    identity: Identity | None = None,
    deliver: Callable[[list[int]], None] = lambda ids: None,
    claimant: str | None = None,
) -> tuple[App, Inbox]:
    """The Bolt app and the inbox that carries out what it accepts (workers start lazily)."""
    client = client or web_client(settings)
    identity = identity or Identity(client)
    bolt_log = logging.getLogger("slack_bolt.App")
    if _quiet not in bolt_log.filters:
        bolt_log.addFilter(_quiet)
    sdk_log = logging.getLogger("slack_sdk.web.base_client")
    if _quiet_sdk not in sdk_log.filters:
        sdk_log.addFilter(_quiet_sdk)
    secret = settings.slack_signing_secret
    token = client.token
    app = App(
        client=client,
        signing_secret=secret.get_secret_value() if secret else None,
        # The listeners only record and ack: run them where the request arrived, no hand-off.
        process_before_response=True,
        token_verification_enabled=False,
        authorize=lambda enterprise_id, team_id: identity.authorize(token, enterprise_id, team_id),
        raise_error_for_unhandled_request=False,
    )
    deps = SlackDeps(services, People(client), settings)
    deps.inbox = Inbox(
        services.db,
        deps.now,
        {
            "command": partial(commands.carry_out, deps),
            "action": partial(actions.carry_out, deps),
            "view": partial(submissions.carry_out, deps),
            "event": partial(events.carry_out, deps),
        },
        prepare=deps.look_up,
        open_view=lambda trigger, view: _open_view(client, trigger, view),
        delivered=deliver,
        claimant=claimant,
        workers=settings.workers,
    )
    commands.register(app, deps)
    actions.register(app, deps)
    submissions.register(app, deps)
    events.register(app, deps)

    @app.error
    def on_error(error: Exception) -> BoltResponse:
        if isinstance(error, NotRecorded):
            return BoltResponse(status=503, body="")
        log.error("a listener failed before its ack", exc_info=error)
        return BoltResponse(status=500, body="")

    return app, deps.inbox


def _open_view(client: WebClient, trigger: str, view: dict[str, Any]) -> None:
    client.views_open(trigger_id=trigger, view=view)
