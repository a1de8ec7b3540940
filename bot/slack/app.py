"""The Bolt app, built in a function (never at import), with every listener registered.

`build_app(settings, services, ...)` is used alike by `gpubot serve` (Socket Mode or HTTP),
the tests (signed requests against the local Slack API) and the local workspace demo.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slack_bolt import App, BoltResponse, Respond
from slack_sdk import WebClient
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from bot.services import Services
from bot.settings import Settings
from bot.slack.acks import AcksFirst
from bot.slack.blocks import home_view
from bot.slack.blocks.kit import Message
from bot.slack.failures import report_failure
from bot.slack.listeners import actions, commands, events, views
from bot.slack.people import People

log = logging.getLogger(__name__)


@dataclass
class SlackDeps:
    """What listeners need: the use cases, people's names and zones, and a nudge for delivery."""

    services: Services
    people: People
    settings: Settings
    kick: Callable[[], None]
    # The work after an ack runs here, on few threads: Bolt's listener threads stay free to
    # start (and ack) the next requests, and the use cases' writes are serial anyway.
    work: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpubot-work")
    )
    # ... and starts once the requests being acked are out of the door (see bot.slack.acks).
    acks: AcksFirst = field(default_factory=AcksFirst)

    def now(self) -> datetime:
        return self.services.ctx.now().astimezone(UTC)

    def after_ack(
        self,
        respond: Respond,
        answer: Callable[[], Message | None],
        *,
        body: dict[str, Any] | None = None,
        client: WebClient | None = None,
    ) -> None:
        """Compute the answer off the listener thread, send it ephemerally, nudge delivery.

        A click on the Home tab has no response_url: its answer goes to the person's DM and
        their Home is drawn again, so what changed shows where they clicked."""
        home = client is not None and body is not None and not body.get("response_url")

        def run() -> None:
            try:
                self.acks.wait_turn()
                reply = answer()
                if home:
                    assert client is not None
                    assert body is not None
                    self._answer_home(client, body["user"]["id"], reply)
                elif reply is not None:
                    respond(**reply.as_kwargs(), response_type="ephemeral", replace_original=False)
            except Exception as exc:  # a failure must still reach the person, with a reference
                report_failure(exc, None if home else respond)
            finally:
                self.kick()

        self.work.submit(run)

    def _answer_home(self, client: WebClient, user: str, reply: Message | None) -> None:
        if reply is not None:
            channel = client.conversations_open(users=user)["channel"]["id"]
            client.chat_postMessage(channel=channel, **reply.as_kwargs())
        client.views_publish(user_id=user, view=home_view(self.services.home(user)))


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


class _ClientFromSettings(logging.Filter):
    """Bolt reads SLACK_BOT_TOKEN from the environment by itself and then warns that the client
    we pass (built from that same token) wins; the warning would only mislead an operator."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


_quiet = _ClientFromSettings()


def build_app(
    settings: Settings,
    services: Services,
    *,
    client: WebClient | None = None,
    kick: Callable[[], None] = lambda: None,
    acks: AcksFirst | None = None,
) -> App:
    client = client or web_client(settings)
    bolt_log = logging.getLogger("slack_bolt.App")
    if _quiet not in bolt_log.filters:
        bolt_log.addFilter(_quiet)
    secret = settings.slack_signing_secret
    app = App(
        client=client,
        signing_secret=secret.get_secret_value() if secret else None,
        process_before_response=False,
        # Work after ack() runs here; enough threads that a busy minute never delays an ack.
        listener_executor=ThreadPoolExecutor(max_workers=32, thread_name_prefix="gpubot-slack"),
        raise_error_for_unhandled_request=False,
    )
    deps = SlackDeps(services, People(client), settings, kick, acks=acks or AcksFirst())
    commands.register(app, deps)
    actions.register(app, deps)
    views.register(app, deps)
    events.register(app, deps)

    @app.error
    def on_error(error: Exception, body: dict[str, Any], respond: Respond) -> BoltResponse | None:
        report_failure(error, respond if body.get("response_url") else None)
        return None

    return app
