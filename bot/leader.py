"""Which replica runs the periodic jobs: the leader, chosen on PostgreSQL, fenced by its epoch.

Every `gpubot serve` on one PostgreSQL serves Slack and the agents and carries out what it
acknowledged; the poll, the sweep, the delivery and retry passes, retention and the rollups run
on the leader only. `advisory` (the default): a session advisory lock held on a connection of its
own, checked every few seconds; `table`: the `leader` row is a lease renewed every few seconds
(for poolers that break session locks). Winning either bumps the epoch; the leader's job
transactions first check it (storage.leader.fence), so a deposed leader's writes are refused.
On SQLite there is one process (serve locks the file) and it always leads. Each replica
records the `address` its HTTP server is reached at; the others read the leader's
(`leader_url`) to forward the node agents' pushes to it (bot.forward).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlmodel import Session

from storage import leader as rows
from storage.db import Database, one_line

log = logging.getLogger(__name__)

Mode = Literal["sole", "advisory", "table"]
#: How often a replica checks its lock (or renews its lease), or tries to take it.
EVERY = timedelta(seconds=2)
#: How long a table lease, and a replica's liveness, last without a renewal.
TTL = timedelta(seconds=15)
#: A stopped replica's liveness row is dropped this long after it expired.
FORGOTTEN_AFTER = timedelta(hours=1)
#: After losing the lock, a replica waits this long before trying again, so another takes it.
STAND_DOWN = 3 * EVERY


#: Server-side probes of the lock's session: idle 5 s, then every 2 s, dropped after 3 misses or
#: 15 s of unacknowledged data.
_SESSION_KEEPALIVE = (
    "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 "
    "-c tcp_user_timeout=15000"
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class DeposedError(RuntimeError):
    """The fence refused a job's write: another replica leads now (the transaction rolled back)."""


class Leader:
    """This process's part in the election: `is_leader`, `epoch`, and `job(...)` to wrap a
    periodic job so that it runs only here while this process leads, fenced by the epoch."""

    def __init__(
        self,
        db: Database,
        mode: Mode,
        *,
        token: str,
        clock: Callable[[], datetime] = _utcnow,
        every: timedelta = EVERY,
        ttl: timedelta = TTL,
        stand_down: timedelta = STAND_DOWN,
    ) -> None:
        self.db, self.mode, self.token, self.clock = db, mode, token, clock
        self.every, self.ttl, self.stand_down = every, ttl, stand_down
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{token}"[:128]
        #: Where the other replicas reach this one's HTTP server ("" when it serves none);
        #: set before `start`.
        self.address = ""
        self._leader_url: str | None = None
        self._epoch: int | None = 0 if mode == "sole" else None
        self._lock = threading.Lock()
        self._rest_until = 0.0
        self._engine: Engine | None = None
        self._connection: Connection | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._stepped = False
        #: Called (on the election's thread) each time this replica becomes the leader.
        self.on_gain: list[Callable[[], None]] = []

    @classmethod
    def for_database(
        cls, db: Database, lock: Literal["advisory", "table"], *, token: str
    ) -> Leader:
        """SQLite: the one process leads. PostgreSQL: elected, by `lock`."""
        return cls(db, "sole" if db.dialect == "sqlite" else lock, token=token)

    @property
    def replicated(self) -> bool:
        """Can other replicas share the database (PostgreSQL)?"""
        return self.mode != "sole"

    @property
    def epoch(self) -> int | None:
        """The epoch this process leads under; None while it does not lead."""
        return self._epoch

    @property
    def is_leader(self) -> bool:
        return self._epoch is not None

    # the election

    def start(self) -> None:
        """Try once now (so the jobs know at once), then keep checking on a thread."""
        if not self.replicated or self._thread is not None:
            return
        self.step()
        self._thread = threading.Thread(target=self._run, name="gpubot-leader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.every.total_seconds()):
            self.step()

    def step(self) -> None:
        """One round: the leader checks that it still leads; the others try to take over."""
        self._stepped = True
        try:
            if self.mode == "advisory":
                self._step_advisory()
            elif self.mode == "table":
                self._step_table()
        except SQLAlchemyError as exc:
            # A connection that failed once (cut by the server, say) is not tried again: the
            # next round opens a new one.
            self._close_connection()
            if self.is_leader:
                self.lost(f"the database failed ({one_line(exc)})")
            else:
                log.debug("leader: cannot try to lead (%s)", one_line(exc))
        self._here()

    def _step_advisory(self) -> None:
        epoch = self._epoch
        if epoch is not None:
            try:
                assert self._connection is not None
                self._connection.execute(sa.text("SELECT 1"))
            except SQLAlchemyError as exc:
                self._close_connection()
                self.lost(f"its lock connection was closed ({one_line(exc)})")
                return
            with self.db.write() as session:
                still = rows.renew(session, epoch, at=self.clock(), ttl=self.ttl)
            if not still:
                self._close_connection()
                self.lost("another replica took over (the epoch moved)")
            return
        if time.monotonic() < self._rest_until:
            return
        connection = self._connect()
        won = connection.execute(
            sa.text("SELECT pg_try_advisory_lock(:key)"), {"key": rows.ADVISORY_KEY}
        ).scalar()
        if not won:
            return
        try:
            with self.db.write() as session:
                epoch = rows.take(
                    session, self.holder, at=self.clock(), ttl=self.ttl, address=self.address
                )
        except BaseException:
            self._close_connection()  # the lock goes with the connection
            raise
        self._gained(epoch)

    def _step_table(self) -> None:
        epoch = self._epoch
        if epoch is not None:
            with self.db.write() as session:
                still = rows.renew(session, epoch, at=self.clock(), ttl=self.ttl)
            if not still:
                self.lost("another replica took the lease (the epoch moved)")
            return
        if time.monotonic() < self._rest_until:
            return
        with self.db.write() as session:
            taken = rows.take_expired(
                session, self.holder, at=self.clock(), ttl=self.ttl, address=self.address
            )
        if taken is not None:
            self._gained(taken)

    def _connect(self) -> Connection:
        """The lock's own connection, outside the pool: the lock lives as long as it does."""
        if self._connection is None:
            if self._engine is None:
                self._engine = sa.create_engine(
                    self.db.url,
                    poolclass=NullPool,
                    connect_args={
                        "application_name": "gpubot leader",
                        "connect_timeout": 5,
                        # A leader whose node vanishes (power, network) must lose the lock in
                        # seconds, not after the server's default two hours of keepalive: the
                        # server probes this session's socket and drops it when unanswered.
                        "options": _SESSION_KEEPALIVE,
                        "keepalives": 1,
                        "keepalives_idle": 5,
                        "keepalives_interval": 2,
                        "keepalives_count": 3,
                    },
                )
            self._connection = self._engine.connect().execution_options(
                isolation_level="AUTOCOMMIT"
            )
        return self._connection

    def _close_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.invalidate()
                connection.close()
            except SQLAlchemyError:
                pass  # a connection the server already cut has nothing left to close

    def _gained(self, epoch: int) -> None:
        with self._lock:
            self._epoch = epoch
        log.info("leader: this replica runs the periodic jobs now (epoch %d)", epoch)
        for call in self.on_gain:
            call()

    def lost(self, why: str) -> None:
        """Stop leading at once: the jobs stop here, and this replica rests a while before it
        tries again, so that another one takes over."""
        with self._lock:
            epoch, self._epoch = self._epoch, None
            self._rest_until = time.monotonic() + self.stand_down.total_seconds()
        if epoch is not None:
            log.warning("leader: %s; epoch %d ends and the periodic jobs stop here", why, epoch)

    def stop(self) -> None:
        """A clean stop: hand the lead over at once (the lease ends now, the lock goes)."""
        self._stopping.set()
        if not self._stepped:  # never took part (SQLite, or a bot assembled but not served)
            return
        if self._thread is not None:
            self._thread.join(10)
        epoch, self._epoch = self._epoch, None
        try:
            with self.db.write() as session:
                if epoch is not None:
                    rows.give_up(session, epoch, at=self.clock())
                rows.gone(session, self.token)
        except SQLAlchemyError as exc:
            log.warning("leader: could not hand over cleanly (%s)", one_line(exc))
        self._close_connection()
        if self._engine is not None:
            self._engine.dispose()

    # replicas' liveness: a claim by a live replica is left to it

    def _here(self) -> None:
        try:
            with self.db.write() as session:
                at = self.clock()
                rows.here(session, self.token, at=at, ttl=self.ttl, address=self.address)
                if self.is_leader:  # the rows of replicas stopped long ago go
                    rows.forget_stopped(session, before=at - FORGOTTEN_AFTER)
        except SQLAlchemyError as exc:
            log.debug("leader: cannot record this replica as alive (%s)", one_line(exc))
        self._look_for_leader()

    # where the leader is reached

    @property
    def leader_url(self) -> str | None:
        """The leader's HTTP address as last read (every round), None while this replica
        leads, none leads, or the leader's record has lapsed (it stopped renewing it)."""
        return None if self.is_leader else self._leader_url

    def _look_for_leader(self) -> None:
        if not self.replicated or self.is_leader:
            self._leader_url = None
            return
        try:
            with self.db.read() as session:
                found = rows.held(session)
        except SQLAlchemyError as exc:
            log.debug("leader: cannot read who leads (%s)", one_line(exc))
            self._leader_url = None
            return
        # An advisory leader renews its row every round too, so a lapsed row is a dead leader.
        if (
            found is None
            or found.holder == self.holder
            or found.expires_at <= self.clock()
            or found.address in ("", self.address)
        ):
            self._leader_url = None
        else:
            self._leader_url = found.address

    def alive(self, token: str) -> bool:
        """Is the replica whose claims carry `token` still serving? (Yes when it cannot be
        told: leaving a row a while is safe, sending it twice is not.)"""
        if not self.replicated or token == self.token:
            return token == self.token
        try:
            with self.db.read() as session:
                return rows.alive(session, token, at=self.clock())
        except SQLAlchemyError:
            return True

    # the jobs

    def job(
        self,
        name: str,
        func: Callable[[], Any],
        *,
        every: timedelta | None = None,
        fenced: bool = True,
    ) -> Callable[[], None]:
        """`func` as a job of the leader: it runs only while this process leads, its write
        transactions fenced by the epoch (`fenced`). `every`: at most once per period, by
        whichever replica leads (a new leader does not repeat a run its predecessor made)."""
        if not self.replicated:

            def plain() -> None:
                func()

            return plain

        def run() -> None:
            epoch = self._epoch
            if epoch is None:
                return
            try:
                with self.db.fenced(lambda runner: self._fence(epoch, runner)):
                    if every is not None:
                        with self.db.write() as session:
                            if not rows.turn(
                                session, name, at=self.clock(), every=every, epoch=epoch
                            ):
                                return
                    if fenced:
                        func()
                if not fenced:
                    func()
            except DeposedError as exc:
                log.warning("job %s stopped: %s", name, exc)

        return run

    def _fence(self, epoch: int, runner: Session | Connection) -> None:
        if self._epoch != epoch:
            raise DeposedError(f"epoch {epoch} no longer leads here; nothing was written")
        if not rows.fence(runner, epoch):
            self.lost("another replica took over (its epoch fenced this one's write)")
            raise DeposedError(f"epoch {epoch} was taken over; the write was rolled back")
