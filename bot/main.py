"""The composition root: settings in, a running bot out (Socket Mode or HTTP), jobs included.

`assemble` wires every part and starts nothing, so tests and the demo reuse it; `serve` runs it.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slack_bolt import App
from slack_sdk import WebClient
from sqlmodel import col, func, select

from bot.jobs import OUTBOX, POLL, RETENTION, SWEEP, Jobs
from bot.rulesdir import read_rules_dir
from bot.services import Services
from bot.services.context import utcnow
from bot.settings import Settings
from bot.slack.acks import AcksFirst
from bot.slack.app import build_app, web_client
from bot.slack.delivery import Deliverer
from bot.slack.notify import renderer
from bot.slack.people import People
from bot.telemetry import history
from bot.telemetry.ingest import Ingest, load_tokens
from bot.telemetry.nvml import NvmlSource
from bot.telemetry.simulated import SimulatedSource
from bot.telemetry.sources import make_source
from bot.telemetry.window import Telemetry
from storage import migrate
from storage.db import Database
from storage.tables import OutboxRow

log = logging.getLogger(__name__)
OUTBOX_EVERY = timedelta(seconds=2)
POLL_EVERY = timedelta(seconds=30)
SWEEP_EVERY = timedelta(minutes=1)
RETENTION_EVERY = timedelta(hours=1)
HISTORY_KEPT = timedelta(days=30)


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
    telemetry: Telemetry
    source: NvmlSource | SimulatedSource | None = None  # None: node agents feed it
    ingest: Ingest | None = None
    acks: AcksFirst | None = None  # shared by the HTTP front and the work after its acks

    def poll(self) -> int:
        """The `poll` job: read the local (or simulated) GPUs, keep per-minute history."""
        if self.source is None:
            return 0
        now = self.services.ctx.now()
        seen = self.telemetry.observe(self.source.poll(now))
        self._store_history(now)
        return seen

    def _store_history(self, now: datetime) -> None:
        rows = self.telemetry.minute_rollups(now)
        if rows:
            with self.db.write() as session:
                history.store_minutes(session, rows)

    def sweep(self) -> None:
        """The `sweep` job: one reconcile pass, then deliver what it owes."""
        if self.source is None:
            self._store_history(self.services.ctx.now())  # agents' samples have history too
        report = self.services.sweep(self.telemetry)
        granted = self.services.serve_queue()  # reclaims and expiries free GPUs for the queue
        if (report.changed or granted) and self.deliverer.want():
            self.jobs.kick(OUTBOX)

    def retain(self) -> None:
        """The `retention` job: per-minute history older than HISTORY_KEPT goes."""
        with self.db.write() as session:
            history.prune(session, self.services.ctx.now() - HISTORY_KEPT)

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
            "telemetry": self.settings.telemetry
            if self.source is None
            else type(self.source).__name__,
        }

    def close(self) -> None:
        self.jobs.shutdown()
        if self.source is not None:
            self.source.close()
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
        db,
        read_rules_dir(settings.rules_dir),
        engine=settings.rules_engine,
        clock=clock,
        enforcer=settings.enforcer,
    )
    client = client or web_client(settings)
    jobs = Jobs()
    deliverer = Deliverer(db, client, renderer(services, People(client)), services.ctx.now)

    def kick() -> None:
        if deliverer.want():
            jobs.kick(OUTBOX)

    acks = AcksFirst()
    app = build_app(settings, services, client=client, kick=kick, acks=acks)
    telemetry = Telemetry(services.policy.timing.stale_after)
    source = None
    if settings.telemetry != "agents":
        source = make_source(
            settings.telemetry, settings.fleet, settings.node_name, start=services.ctx.now()
        )
    ingest = None
    if settings.agent_tokens_file is not None:
        ingest = Ingest(
            load_tokens(settings.agent_tokens_file),
            telemetry,
            services.ctx.now,
            on_refused=lambda node, why: _refused_agent(services, node, why),
            orders=services.take_orders,
            results=services.record_results,
        )
    bot = Bot(settings, db, services, client, app, deliverer, jobs, telemetry, source, ingest, acks)
    # The periodic jobs, like the work after an ack, let the requests being acked go first.
    jobs.every(OUTBOX, OUTBOX_EVERY, _after_acks(acks, deliverer.run))
    jobs.every(POLL, POLL_EVERY, _after_acks(acks, bot.poll))
    jobs.every(SWEEP, SWEEP_EVERY, _after_acks(acks, bot.sweep))
    jobs.every(RETENTION, RETENTION_EVERY, _after_acks(acks, bot.retain))
    return bot


def _after_acks(acks: AcksFirst, job: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        acks.wait_turn()
        return job()

    return run


def _refused_agent(services: Services, node: str, why: str) -> None:
    """A node agent was turned away: log it and keep it in the audit log."""
    log.warning("agent request from %r refused: %s", node, why)
    services.record_refused_agent(node, why)


def serve(settings: Settings, *, http: bool, host: str, port: int) -> None:
    """Run until interrupted: Socket Mode when SLACK_APP_TOKEN is set (unless --http), else HTTP."""
    if settings.slack_bot_token is None:
        raise SetupError("SLACK_BOT_TOKEN is not set: the bot token (xoxb-...) is required.")
    socket_mode = settings.slack_app_token is not None and not http
    if not socket_mode and settings.slack_signing_secret is None:
        raise SetupError(
            "HTTP mode needs SLACK_SIGNING_SECRET (Slack signs every request with it); "
            "or set SLACK_APP_TOKEN (xapp-...) for Socket Mode."
        )
    bot = assemble(settings)
    # What start-up built lives as long as the process: out of the collector's way, so a full
    # collection (tens of milliseconds over every import and compiled rule) never stalls acks.
    gc.collect()
    gc.freeze()
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
            asgi = SlackAsgi(bot.app, bot.health, ingest=bot.ingest, acks=bot.acks)
            uvicorn.run(asgi, host=host, port=port, log_level="info")
    finally:
        bot.close()
