"""The composition root: settings in, a running bot out (Socket Mode or HTTP), jobs included.

`assemble` wires every part and starts nothing, so tests and the demo reuse it; `serve` runs it.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

from slack_bolt import App
from slack_sdk import WebClient
from sqlalchemy.exc import SQLAlchemyError

from bot import memory
from bot.forward import AdvertiseError, Forwarder, advertise_url
from bot.jobs import INBOX, OUTBOX, OUTCOMES, POLL, RETENTION, ROLLUP, SWEEP, Jobs
from bot.leader import Leader
from bot.metrics import SWEEP_SECONDS, build_registry, store_checkpoint
from bot.server import MetricsAccess, MetricsPort
from bot.services import Services, rollups
from bot.services.context import utcnow
from bot.services.rule_files import read_rules_dir
from bot.settings import Settings
from bot.slack.app import BAD_TOKEN, Identity, build_app, web_client
from bot.slack.delivery import Deliverer
from bot.slack.inbox import Inbox
from bot.slack.notify import renderer
from bot.slack.people import People
from bot.telemetry.agent_push import Ingest, load_tokens
from bot.telemetry.dcgm import DcgmSource
from bot.telemetry.errors import TelemetryUnavailable
from bot.telemetry.promapi import PrometheusSource
from bot.telemetry.reach import Reach, health_fields
from bot.telemetry.sources import Feed, Source, choose
from bot.telemetry.window import TelemetryWindow
from storage import agent_reads, gpus, inbox, keyvalue, migrate, outbox
from storage.db import Database, normalise_url, one_line
from storage.leader import starting

log = logging.getLogger(__name__)
OUTBOX_EVERY = timedelta(seconds=2)
INBOX_EVERY = timedelta(seconds=5)  # retries what the database refused; a restart drains at once
POLL_EVERY = timedelta(seconds=30)
SWEEP_EVERY = timedelta(minutes=1)
RETENTION_EVERY = timedelta(hours=1)
ROLLUP_EVERY = timedelta(minutes=10)  # it only works when another hour has completed
HISTORY_KEPT = rollups.MINUTES_KEPT
#: With replicas the sweep job looks this often whether a minute has passed since the last
#: sweep by any leader, so a new leader sweeps on time and never twice in one minute.
SWEEP_LOOK_EVERY = timedelta(seconds=5)
#: With replicas, an acknowledged request is its replica's to carry out for this long before
#: the leader's retry pass takes it (that replica may have stopped).
INBOX_HANDOFF = timedelta(seconds=10)


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
    telemetry: TelemetryWindow
    inbox: Inbox
    identity: Identity
    source: Source | None = None  # None: node agents feed it, or nothing
    ingest: Ingest | None = None
    closed: bool = False
    feed: Feed | None = None  # what assemble chose; the kind and note /healthz reports
    # When this process began to expect samples; None when no telemetry is configured at all.
    watching_since: datetime | None = None
    telemetry_problem: str = ""  # why the source cannot be read right now ("" when it can)
    leader: Leader | None = None  # which replica runs the periodic jobs (None: not elected)

    def poll(self) -> int:
        """The `poll` job: read the local (or simulated) GPUs, keep per-minute history, and
        write down what the fleet shows (agents' pushes included)."""
        seen = 0
        if self.source is not None:
            now = self.services.now()
            try:
                samples = self.source.poll(now)
            except TelemetryUnavailable as exc:
                self._unavailable(str(exc))
            else:
                self._unavailable("")
                seen = self.telemetry.observe(samples)
            self._store_history(now)
        self.observe_fleet()
        return seen

    def _unavailable(self, why: str) -> None:
        """NVML cannot be read: one warning line when that starts or its reason changes, one
        when it works again (never a traceback every poll); /healthz says so meanwhile."""
        if why == self.telemetry_problem:
            return
        if why:
            log.warning("telemetry: %s; the GPUs stay unknown until it can be read", why)
        else:
            log.info("telemetry: NVML reads this host's GPUs again")
        self.telemetry_problem = why

    def observe_fleet(self) -> None:
        """Write down what the fleet shows; what it owes people goes out now."""
        report = self.services.observe_fleet(self.telemetry, self.watching_since)
        if (report.events or report.intruders) and self.deliverer.want():
            self.jobs.kick(OUTBOX)

    def _store_history(self, now: datetime) -> None:
        rows = self.telemetry.minute_rollups(now)
        if rows:
            with self.db.write() as session:
                gpus.store_minutes(session, rows)

    def sweep(self) -> None:
        """The `sweep` job: one reconcile pass, then deliver what it owes."""
        if self.source is None:
            self._store_history(self.services.now())  # agents' samples have history too
        with SWEEP_SECONDS.time():
            report = self.services.sweep(self.telemetry)  # the poll job observed the fleet already
        granted = self.services.serve_queue()  # reclaims and expiries free GPUs for the queue
        digests = self.services.send_digests()  # reports, not automation: sent even when paused
        self.services.enforce(self.settings.kubeconfig)  # scheduler commands after the commits
        if (report.changed or granted or digests) and self.deliverer.want():
            self.jobs.kick(OUTBOX)

    def took_over(self) -> None:
        """This replica leads from now: its telemetry window holds nothing yet (the pushes
        went to the old leader), so it waits as a newly started bot does before it calls a
        node silent."""
        if self.watching_since is not None:
            self.watching_since = self.services.now()

    def retain(self) -> None:
        """The `retention` job: per-minute history older than HISTORY_KEPT goes (never a minute
        the hourly rollup has not rolled yet, nor one of the hours its next pass rolls again),
        and so do inbox rows old enough that Slack can no longer retry them."""
        now = self.services.now()
        with self.db.write() as session:
            rolled = keyvalue.rolled_until(session)
            kept = now - HISTORY_KEPT
            # After a long stop the next rollup rolls the hours before `rolled` again; their
            # minutes must still be there, or they would be rolled as unknown.
            until = kept if rolled is None else min(kept, rolled - rollups.AGAIN)
            gpus.prune_minutes(session, until)
            inbox.prune(session, now - inbox.KEPT)

    def rollup(self) -> None:
        """The `rollup` job: the hours completed since the last pass go into the hourly table,
        and the /metrics checkpoint moves on (a replica's first scrape starts from it)."""
        now = self.services.now()
        rollups.run(self.services.ctx, now)
        store_checkpoint(self.db, now)

    def writable(self) -> bool:
        """Can the database take a write right now? (One tiny committed write, waited on for
        at most a couple of seconds.)"""
        try:
            with self.db.brief() as session:
                keyvalue.probe(session, at=self.services.now(), by="gpubot")
        except SQLAlchemyError as exc:
            log.warning("health: the database cannot be written (%s)", one_line(exc))
            return False
        return True

    def health(self) -> dict[str, Any]:
        """/healthz: status words only (never a driver's error, which names hosts and ports)."""
        if not self.writable():
            return {"ok": False, "database": "unwritable"}
        try:
            with self.db.read() as session:
                waiting = inbox.backlog(session)
                owed = outbox.counts(session)
        except SQLAlchemyError:
            return {"ok": False, "database": "unreadable"}
        return {
            "ok": True,
            "database": "ok",
            "database_kind": self.db.dialect,
            "slack": "ok" if self.identity.checked.is_set() else "not yet reached",
            "rules_revision": self.services.policy.revision,
            "engine": self.services.engine_name,
            "automation_paused": self.services.paused(),
            "inbox_pending": waiting,
            "outbox_pending": owed.get(outbox.PENDING, 0) + owed.get(outbox.SENDING, 0),
            "outbox_failed": owed.get(outbox.FAILED, 0),
            "telemetry": self.feed.kind if self.feed else "none",
            **health_fields(
                self._reach(), self.telemetry_problem, self.feed.note if self.feed else ""
            ),
            **self._leadership(),
        }

    def _reach(self) -> Reach | None:
        """How much of the fleet the DCGM or Prometheus source read at its last poll (the
        leader polls; a follower's source has read nothing yet)."""
        if isinstance(self.source, DcgmSource | PrometheusSource):
            return self.source.reach()
        return None

    def _leadership(self) -> dict[str, Any]:
        """/healthz: does this process run the periodic jobs, under which fencing epoch?"""
        leader = self.leader
        if leader is None:
            return {"leader": True, "leader_epoch": None, "leader_lock": "none"}
        return {
            "leader": leader.is_leader,
            "leader_epoch": leader.epoch,
            "leader_lock": leader.mode,
        }

    def ready(self) -> dict[str, Any]:
        """/readyz: can this process take Slack's requests (record them) right now?"""
        ok = self.writable()
        return {"ok": ok, "database": "ok" if ok else "unwritable"}

    def close(self) -> None:
        """Stop the jobs, let the workers and the express thread finish what they hold, close."""
        if self.closed:
            return
        self.closed = True
        self.jobs.shutdown()
        if self.leader is not None:
            self.leader.stop()  # after the jobs: a successor takes over at once
        self.identity.stop()
        self.inbox.stop()
        self.deliverer.close()
        if self.source is not None:
            self.source.close()
        self.services.close()
        self.db.dispose()
        log.info(
            "gpubot stopped: what it had begun is finished or left recorded for the next start"
        )


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
    try:
        with starting(db):  # replicas starting together write the rules one at a time
            services = Services.open(
                db,
                read_rules_dir(settings.rules_dir),
                engine=settings.rules_engine,
                clock=clock,
                enforcer=settings.enforcer,
            )
    except BaseException:
        db.dispose()
        raise
    if services.engine_name != settings.rules_engine:
        log.warning(
            "rules: the %s engine cannot be imported on this Python; deciding with the %s engine",
            settings.rules_engine,
            services.engine_name,
        )
    try:
        return _wire(settings, db, services, client or web_client(settings))
    except BaseException:  # a fleet file or token file that cannot be read: nothing left open
        services.close()
        db.dispose()
        raise


def _wire(settings: Settings, db: Database, services: Services, client: WebClient) -> Bot:
    """The Slack app, delivery, telemetry and the jobs around the use cases."""
    jobs = Jobs()
    deliverer = Deliverer(db, client, renderer(services, People(client)), services.now)

    identity = Identity(client)
    app, inbox_ = build_app(
        settings,
        services,
        client=client,
        identity=identity,
        deliver=deliverer.express,  # what a request owed goes out at once, on its own thread
        claimant=deliverer.token,
    )
    telemetry = TelemetryWindow(services.policy.timing.stale_after, clock=services.now)
    feed = choose(
        settings.telemetry,
        agents=settings.agent_tokens_file is not None,
        fleet_path=settings.fleet,
        node_name=settings.node_name,
        start=services.now(),
        dcgm_endpoints=settings.dcgm_endpoints_file,
        prometheus_url=settings.prometheus_url,
        stale_after=services.policy.timing.stale_after,
    )
    ingest = None
    if settings.agent_tokens_file is not None:
        ingest = Ingest(
            load_tokens(settings.agent_tokens_file),
            telemetry,
            services.now,
            on_refused=services.record_refused_agent,
            orders=services.take_orders,
            results=services.record_results,
            spend=services.spend_nonce,
            pending=lambda: agent_reads.nodes_with_orders(db),
        )
    bot = Bot(
        settings,
        db,
        services,
        client,
        app,
        deliverer,
        jobs,
        telemetry,
        inbox_,
        identity,
        feed.source,
        ingest,
        feed=feed,
        watching_since=None if feed.kind == "none" else services.now(),
        leader=Leader.for_database(db, settings.leader_lock, token=deliverer.token),
    )
    _schedule(bot)
    return bot


def _schedule(bot: Bot) -> None:
    """The periodic jobs, each run only by the leader. The delivery and retry passes are not
    fenced: their claims already keep two replicas from sending or running one row twice, and
    an outcome already sent must be recorded."""
    leader = bot.leader
    assert leader is not None
    if leader.replicated:
        leader.on_gain.append(bot.took_over)
    jobs, deliverer, inbox_ = bot.jobs, bot.deliverer, bot.inbox
    deliverer.alive = leader.alive
    if leader.replicated:
        inbox_.handoff = INBOX_HANDOFF
        sweep_every = SWEEP_LOOK_EVERY
    else:
        sweep_every = SWEEP_EVERY
    jobs.every(INBOX, INBOX_EVERY, leader.job(INBOX, inbox_.run_due, fenced=False))
    if leader.replicated:  # every replica records its own sends; the pass is the leader's
        jobs.every(OUTCOMES, OUTBOX_EVERY * 5, deliverer.record_kept)
    jobs.every(OUTBOX, OUTBOX_EVERY, leader.job(OUTBOX, deliverer.run, fenced=False))
    jobs.every(POLL, POLL_EVERY, leader.job(POLL, bot.poll))
    jobs.every(SWEEP, sweep_every, leader.job(SWEEP, bot.sweep, every=SWEEP_EVERY))
    jobs.every(RETENTION, RETENTION_EVERY, leader.job(RETENTION, bot.retain))
    jobs.every(ROLLUP, ROLLUP_EVERY, leader.job(ROLLUP, bot.rollup))


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
    memory.tame()  # before the threads: glibc's arenas capped, the heap trimmed after bursts
    with _alone(settings.database_url):
        _serve(settings, socket_mode=socket_mode, host=host, port=port)


def _serve(settings: Settings, *, socket_mode: bool, host: str, port: int) -> None:
    listening = _listen(host, port) if not socket_mode else None
    try:
        bot = assemble(settings)
    except BaseException:
        if listening is not None:
            listening.close()
        raise
    problem = bot.identity.check(quick=True)
    if bot.identity.rejected is not None:
        bot.close()
        if listening is not None:
            listening.close()
        raise SetupError(
            f"Slack refused SLACK_BOT_TOKEN ({bot.identity.rejected}): copy the Bot User "
            "OAuth Token (xoxb-...) from the app's OAuth & Permissions page."
        )
    if problem is not None:
        log.warning("auth.test: %s; serving anyway and retrying in the background", problem)
        bot.identity.keep_checking()
    # What start-up built lives as long as the process: out of the collector's way, so a full
    # collection (tens of milliseconds over every import and compiled rule) never stalls acks.
    gc.collect()
    gc.freeze()
    memory.schedule_collector()  # full walks every five minutes, not every few seconds of pushes
    drained = bot.inbox.run_due()  # what an earlier run acknowledged and did not finish
    if drained:
        log.info("carrying out %d acknowledged requests left by the last run", drained)
    forward = _forwarder(bot, settings, host, port) if listening is not None else None
    if bot.leader is not None:
        bot.leader.start()  # the first try is made now, so the first ticks know who leads
    bot.jobs.start()
    metrics = MetricsAccess(build_registry(bot.services, health=bot.health), settings.metrics_token)
    side = MetricsPort(metrics, bot.health, bot.ready)  # Socket Mode's, or beside the HTTP port
    try:
        side.listen(host, settings.metrics_port, beside=None if listening is None else port)
        if listening is None:
            assert settings.slack_app_token is not None
            log.info("gpubot: Socket Mode, rules %s", bot.services.policy.revision)
            _socket_mode(bot, settings.slack_app_token.get_secret_value())
        else:
            import uvicorn  # noqa: PLC0415 - only HTTP mode needs the server

            from bot.server import SlackAsgi  # noqa: PLC0415

            log.info("gpubot: HTTP on %s:%s/slack/events", host, port)
            # uvicorn re-raises SIGTERM once it has stopped, which ends the process before any
            # `finally` here: the bot is closed at the ASGI shutdown instead.
            asgi = SlackAsgi(
                bot.app,
                bot.health,
                ingest=bot.ingest,
                ready=bot.ready,
                on_shutdown=bot.close,
                metrics=metrics,
                forward=forward,
            )
            server = uvicorn.Server(uvicorn.Config(asgi, log_level="info"))
            server.run(sockets=[listening])
    finally:
        side.stop()
        if forward is not None:
            forward.close()
        bot.close()


def _forwarder(bot: Bot, settings: Settings, host: str, port: int) -> Forwarder | None:
    """Replicas taking node agents' pushes: this one's address is recorded for the others,
    and while it follows, the pushes it takes go on to the leader's."""
    leader = bot.leader
    if leader is None or not leader.replicated or bot.ingest is None:
        return None
    try:
        leader.address = advertise_url(settings.advertise_url, host, port)
    except AdvertiseError as exc:
        bot.close()
        raise SetupError(str(exc)) from None
    log.info("replicas: the others reach this one at %s", leader.address or "(unknown)")
    return Forwarder(leader, own=leader.address)


@contextmanager
def _alone(url: str) -> Iterator[None]:
    """SQLite serves one process: an exclusive lock on a file beside the database, held while
    this one serves, stops a second `gpubot serve` with the reason. `gpubot demo` and the
    admin commands open the database without it; PostgreSQL takes replicas."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        yield
        return
    held = _lock_file(parsed.database or "")
    try:
        yield
    finally:
        held.close()  # the lock goes with the file


def _lock_file(database: str) -> IO[str]:
    """The lock file beside `database`, locked and holding this pid; SetupError when taken."""
    path = Path(f"{database}.serve.lock")
    try:
        held = path.open("a+", encoding="utf-8")
    except OSError as exc:
        raise SetupError(
            f"cannot open {path} ({exc.strerror or exc}): serve keeps a lock file beside the "
            "SQLite database; let it write in that folder."
        ) from None
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        pid = held.read().strip() or "unknown"
        held.close()
        raise SetupError(
            f"another gpubot serve (pid {pid}) is running on the SQLite database "
            f"{database} (it holds {path}). SQLite takes one bot process; to run "
            "replicas, point GPUBOT_DATABASE_URL of every one at the same PostgreSQL."
        ) from None
    held.seek(0)
    held.truncate()
    held.write(f"{os.getpid()}\n")
    held.flush()
    return held


def _listen(host: str, port: int) -> socket.socket:
    """The HTTP port, taken before anything starts: a port in use stops serve at once."""
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        raise SetupError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): is another gpubot "
            "running there? Choose another --port."
        ) from None
    listening.listen(2048)
    listening.set_inheritable(True)
    return listening


def _socket_mode(bot: Bot, app_token: str) -> None:
    """Connect out to Slack and stay connected; while Slack cannot be reached, keep trying
    (2 s, 4 s ... at most 5 minutes) instead of exiting."""
    from slack_bolt.adapter.socket_mode import SocketModeHandler  # noqa: PLC0415
    from slack_sdk.errors import SlackApiError, SlackClientError  # noqa: PLC0415

    handler = SocketModeHandler(bot.app, app_token)
    wait = 2.0
    while True:
        try:
            handler.connect()  # type: ignore[no-untyped-call]  # slack_bolt leaves it unannotated
            break
        except SlackApiError as exc:
            error = str(exc.response.get("error", "?"))
            if error in BAD_TOKEN:
                raise SetupError(
                    f"Slack refused SLACK_APP_TOKEN ({error}): make an app-level token with "
                    "the connections:write scope (Basic Information, App-Level Tokens)."
                ) from None
            log.warning("Socket Mode: Slack answered %s; retrying in %.0f s", error, wait)
        except (SlackClientError, OSError) as exc:
            log.warning("Socket Mode: cannot connect (%s); retrying in %.0f s", exc, wait)
        time.sleep(wait)
        wait = min(wait * 2, 300.0)
    try:
        threading.Event().wait()
    finally:
        handler.close()  # type: ignore[no-untyped-call]
