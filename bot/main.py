"""The composition root: settings in, a running bot out (Socket Mode or HTTP), jobs included.

`assemble` wires every part and starts nothing, so tests and the demo reuse it; `serve` runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slack_bolt import App
from slack_sdk import WebClient
from sqlmodel import col, func, select

from bot.jobs import OUTBOX, Jobs
from bot.rulesdir import read_rules_dir
from bot.services import Services
from bot.services.context import utcnow
from bot.settings import Settings
from bot.slack.app import build_app, web_client
from bot.slack.delivery import Deliverer
from bot.slack.notify import renderer
from bot.slack.people import People
from storage import migrate
from storage.db import Database
from storage.tables import OutboxRow

log = logging.getLogger(__name__)
OUTBOX_EVERY = timedelta(seconds=2)


class SetupError(RuntimeError):
    """The bot cannot start as configured; the message says what to set."""


@dataclass
class Bot:
    settings: Settings
    db: Database
    services: Services
    client: WebClient
    app: App
    deliverer: Deliverer
    jobs: Jobs

    def health(self) -> dict[str, Any]:
        try:
            with self.db.read() as session:
                pending = session.exec(
                    select(func.count())
                    .select_from(OutboxRow)
                    .where(col(OutboxRow.state) == "pending")
                ).one()
        except Exception as exc:
            return {"ok": False, "database": f"{type(exc).__name__}: {exc}"}
        return {
            "ok": True,
            "rules_revision": self.services.policy.revision,
            "engine": self.services.ctx.live.engine_name,
            "database": self.db.dialect,
            "automation_paused": self.services.paused(),
            "outbox_pending": int(pending),
        }

    def close(self) -> None:
        self.jobs.shutdown()
        self.services.ctx.live.close()
        self.db.dispose()


def assemble(
    settings: Settings,
    *,
    clock: Callable[[], datetime] = utcnow,
    client: WebClient | None = None,
    upgrade: bool = True,
) -> Bot:
    """Migrate the database, load the rules, build the Slack app and the jobs (not started)."""
    if settings.slack_bot_token is None and client is None:
        raise SetupError("SLACK_BOT_TOKEN is not set: the bot token (xoxb-...) is required.")
    if upgrade:
        migrate.upgrade(settings.database_url)
    db = Database(settings.database_url)
    services = Services.open(
        db, read_rules_dir(settings.rules_dir), engine=settings.rules_engine, clock=clock
    )
    client = client or web_client(settings)
    jobs = Jobs()
    deliverer = Deliverer(db, client, renderer(services, People(client)), services.ctx.now)

    def kick() -> None:
        if deliverer.want():
            jobs.kick(OUTBOX)

    app = build_app(settings, services, client=client, kick=kick)
    jobs.every(OUTBOX, OUTBOX_EVERY, deliverer.run)
    return Bot(settings, db, services, client, app, deliverer, jobs)


def serve(settings: Settings, *, http: bool, host: str, port: int) -> None:
    """Run until interrupted: Socket Mode when SLACK_APP_TOKEN is set (unless --http), else HTTP."""
    socket_mode = settings.slack_app_token is not None and not http
    if not socket_mode and settings.slack_signing_secret is None:
        raise SetupError(
            "HTTP mode needs SLACK_SIGNING_SECRET (Slack signs every request with it); "
            "or set SLACK_APP_TOKEN (xapp-...) for Socket Mode."
        )
    bot = assemble(settings)
    bot.jobs.start()
    try:
        if socket_mode:
            from slack_bolt.adapter.socket_mode import SocketModeHandler  # noqa: PLC0415

            assert settings.slack_app_token is not None
            log.info("gpubot: Socket Mode, rules %s", bot.services.policy.revision)
            handler = SocketModeHandler(bot.app, settings.slack_app_token.get_secret_value())
            handler.start()  # type: ignore[no-untyped-call]  # slack_bolt leaves it unannotated
        else:
            import uvicorn  # noqa: PLC0415 - only HTTP mode needs the server

            from bot.server import SlackAsgi  # noqa: PLC0415

            log.info("gpubot: HTTP on %s:%s/slack/events", host, port)
            uvicorn.run(SlackAsgi(bot.app, bot.health), host=host, port=port, log_level="info")
    finally:
        bot.close()
