"""The database handle: one SQLAlchemy engine per URL, and the sessions and transactions on it.

SQLite (the embedded default) and PostgreSQL (production) are both first-class.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool
from sqlmodel import Session, SQLModel

import storage.tables  # noqa: F401  (registers the tables on SQLModel.metadata)

_S = TypeVar("_S", bound=sa.Select[Any])
_G = TypeVar("_G", bound=sa.GenerativeSelect)

#: Execution option carried by the write engine; the SQLite `begin` hook reads it.
_WRITE_OPTION = "gpubot_write"
_SQLITE_BUSY_TIMEOUT_MS = 30_000
#: A fence: run first in a write transaction; raises to refuse the transaction.
Fence = Callable[[Session | Connection], None]
#: The most a brief write (`Database.brief`) waits for the database, all waits together,
#: before it gives up: well inside the 3 s Slack gives an ack.
BRIEF_WAIT = timedelta(seconds=2)


def normalise_url(url: str) -> sa.URL:
    """Parse `url`, sending every PostgreSQL spelling to the psycopg 3 driver."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _is_memory(url: sa.URL) -> bool:
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


@dataclass(eq=False)
class _Waiter:
    thread: int
    handed: threading.Event = field(default_factory=threading.Event)


class _Writers:
    """The SQLite writers of one process, in line for the database's single write lock: first
    come, first served, the lock handed straight to the next in line (no stampede of waiters
    racing for it), except that a brief write (an ack recording its request) goes before every
    writer still waiting, so a busy minute of decisions never holds up Slack's acks.
    Re-entrant within a thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._urgent: deque[_Waiter] = deque()
        self._others: deque[_Waiter] = deque()

    def acquire(self, *, urgent: bool = False, timeout: float | None = None) -> bool:
        me = threading.get_ident()
        with self._lock:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is None and not self._urgent and not self._others:
                self._owner, self._depth = me, 1
                return True
            waiter = _Waiter(me)
            line = self._urgent if urgent else self._others
            line.append(waiter)
        if waiter.handed.wait(timeout):
            return True
        with self._lock:
            if waiter.handed.is_set():  # handed over just as the wait ran out
                return True
            line.remove(waiter)
            return False

    def release(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth:
                return
            line = self._urgent or self._others
            if not line:
                self._owner = None
                return
            waiter = line.popleft()
            self._owner, self._depth = waiter.thread, 1
            waiter.handed.set()

    @contextmanager
    def held(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()


class Database:
    """Owns the engine for one database URL and hands out sessions.

    `write()` is one transaction: committed when the block ends, rolled back when it raises.
    On SQLite it starts with BEGIN IMMEDIATE, so a read-then-write transaction takes the write
    lock up front and waits (busy timeout) instead of failing with "database is locked" when
    another writer got there first; the writers of this process queue on a lock before that,
    so they wake the moment the one before them commits instead of polling SQLite's busy handler.
    An in-memory SQLite database has a single connection, so its sessions take turns across
    threads and must not be nested.

    `unit()` is a unit of work: one write transaction that every `write()` and `read()` of the
    same thread joins until it ends (a `write()` inside it is a savepoint), so a use case and
    the bookkeeping around it commit together or not at all.
    """

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = normalise_url(url)
        self._turns: threading.RLock | None = None
        self._writers: _Writers | None = None
        self._ambient = threading.local()
        self._fences = threading.local()
        self._brief_engine: Engine | None = None
        if self.url.get_backend_name() == "sqlite" and not _is_memory(self.url):
            self._writers = _Writers()
        if self.url.get_backend_name() == "sqlite":
            self.engine = self._sqlite_engine(echo)
        else:
            # A connection the server dropped (restart, idle timeout) is replaced, not raised.
            self.engine = sa.create_engine(self.url, echo=echo, pool_pre_ping=True)
        self._writer = self.engine.execution_options(**{_WRITE_OPTION: True})
        #: Run at the end of every write transaction, before it commits (and by `settle`):
        #: bookkeeping owed for whatever the transaction changed.
        self.before_commit: list[Callable[[Session], None]] = []

    def _sqlite_engine(self, echo: bool, busy_timeout_ms: int | None = None) -> Engine:
        busy_timeout_ms = busy_timeout_ms or _SQLITE_BUSY_TIMEOUT_MS
        memory = _is_memory(self.url)
        if memory:
            # One connection is the whole database; StaticPool keeps it alive for every thread.
            self._turns = threading.RLock()
            engine = sa.create_engine(
                self.url,
                echo=echo,
                poolclass=StaticPool,
                connect_args={"check_same_thread": False},
            )
        else:
            engine = sa.create_engine(self.url, echo=echo)

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
            # pysqlite's own transaction handling would issue a deferred BEGIN lazily;
            # take it over so `_on_begin` decides how each transaction starts.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
                cursor.execute("PRAGMA foreign_keys = ON")
                if not memory:
                    cursor.execute("PRAGMA journal_mode = WAL")
                    # In WAL mode NORMAL survives an application crash and skips the fsync per
                    # commit that would otherwise cap us at a few hundred transactions a second;
                    # only an OS crash or power cut can lose the last commits.
                    cursor.execute("PRAGMA synchronous = NORMAL")
            finally:
                cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(connection: Connection) -> None:
            if connection.get_execution_options().get(_WRITE_OPTION):
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                connection.exec_driver_sql("BEGIN")

        return engine

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.engine.dialect.name

    def holds_others_off(self) -> bool:
        """Does a block of this thread keep other threads off the database while it runs (one
        in-memory connection taken in turns, or a unit of work's write transaction)? A long
        read should then not wait for others between its chunks: they wait for it."""
        return self._turns is not None or self._joined() is not None

    def _turn(self) -> AbstractContextManager[Any]:
        return self._turns if self._turns is not None else nullcontext()

    def _write_turn(self) -> AbstractContextManager[Any]:
        if self._turns is not None:
            return self._turns
        return self._writers.held() if self._writers is not None else nullcontext()

    def _joined(self) -> Session | None:
        session: Session | None = getattr(self._ambient, "session", None)
        return session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session inside one write transaction: commit on success, rollback on exception.

        Inside a `unit()`, a savepoint of the unit's transaction instead."""
        joined = self._joined()
        if joined is not None:
            with joined.begin_nested():
                yield joined
            return
        with (
            self._write_turn(),
            Session(self._writer, expire_on_commit=False) as session,
            session.begin(),
        ):
            self._check_fence(session)
            yield session
            self.settle(session)

    @contextmanager
    def fenced(self, fence: Fence) -> Iterator[None]:
        """Every write transaction this thread opens inside the block runs `fence` first, which
        raises to refuse it (the leader's jobs: a deposed leader's writes never commit)."""
        before = getattr(self._fences, "fence", None)
        self._fences.fence = fence
        try:
            yield
        finally:
            self._fences.fence = before

    def _check_fence(self, runner: Session | Connection) -> None:
        fence: Fence | None = getattr(self._fences, "fence", None)
        if fence is not None:
            fence(runner)

    def settle(self, session: Session) -> None:
        """Run the before-commit hooks now, for a caller that hands on what they owe before
        its transaction commits; running them again at the commit owes nothing twice."""
        for hook in self.before_commit:
            hook(session)

    @contextmanager
    def read(self, *, snapshot: bool = False) -> Iterator[Session]:
        """A session for reads; whatever it did is rolled back when the block ends.

        `snapshot`: every statement of the block sees the database as the first one saw it
        (PostgreSQL's REPEATABLE READ; a SQLite read transaction always does), for reads that
        must agree with each other, as the sweep's GPUs and the leases holding them.
        Inside a `unit()`, the unit's own session, so reads see what the unit wrote."""
        joined = self._joined()
        if joined is not None:
            yield joined
            return
        with self._turn(), Session(self.engine, expire_on_commit=False) as session:
            if snapshot and self.dialect == "postgresql":
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield session

    @contextmanager
    def unit(self) -> Iterator[Session]:
        """One write transaction that the thread's `write()` and `read()` calls join."""
        if self._joined() is not None:
            raise RuntimeError("units of work do not nest")
        with self.write() as session:
            self._ambient.session = session
            try:
                yield session
            finally:
                self._ambient.session = None

    @contextmanager
    def brief(self) -> Iterator[Session]:
        """A short write transaction that waits at most BRIEF_WAIT for the database and then
        raises (sqlalchemy.exc.OperationalError) instead of waiting on: the ack path uses it,
        since Slack gives a request 3 seconds and then shows the person an error."""
        if self._turns is not None:  # one in-memory connection: nothing else to wait for
            with self.write() as session:
                yield session
            return
        wait_s = BRIEF_WAIT.total_seconds() / 2  # two waits in a row, each given half
        if self.dialect == "sqlite":
            # In-process writers queue on the lock; another process holding SQLite's lock is
            # waited out by this engine's shorter busy timeout.
            assert self._writers is not None
            if not self._writers.acquire(urgent=True, timeout=wait_s):
                raise sa.exc.OperationalError("BEGIN", {}, TimeoutError("database is busy"))
            try:
                with (
                    Session(self._brief_writer(), expire_on_commit=False) as session,
                    session.begin(),
                ):
                    yield session
            finally:
                self._writers.release()
            return
        with Session(self._brief_writer(), expire_on_commit=False) as session, session.begin():
            ms = int(wait_s * 1000)
            session.execute(sa.text(f"SET LOCAL lock_timeout = {ms}"))
            session.execute(sa.text(f"SET LOCAL statement_timeout = {ms}"))
            yield session

    def _brief_writer(self) -> Engine:
        if self._brief_engine is None:
            wait_s = BRIEF_WAIT.total_seconds() / 2  # connecting, then the statement
            if self.dialect == "sqlite":
                engine = self._sqlite_engine(False, busy_timeout_ms=int(wait_s * 1000))
            else:
                engine = sa.create_engine(
                    self.url,
                    pool_pre_ping=True,
                    pool_size=2,
                    connect_args={"connect_timeout": max(1, int(wait_s))},
                )
            self._brief_engine = engine.execution_options(**{_WRITE_OPTION: True})
        return self._brief_engine

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A Core connection in one write transaction (migrations, bulk maintenance)."""
        with self._write_turn(), self._writer.begin() as connection:
            self._check_fence(connection)
            yield connection

    def create_all(self) -> None:
        """Create every table straight from the models (tests; production uses migrations)."""
        with self.begin() as connection:
            SQLModel.metadata.create_all(connection)

    def dispose(self) -> None:
        """Close every pooled connection (an in-memory database is gone afterwards)."""
        self.engine.dispose()
        if self._brief_engine is not None:
            self._brief_engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"


def lock_for_update(session: Session, stmt: _S) -> _S:
    """Add FOR UPDATE where it means something: PostgreSQL. SQLite writers are already serial."""
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update()
    return stmt


def skip_locked(session: Session, stmt: _G) -> _G:
    """FOR UPDATE SKIP LOCKED on PostgreSQL: rows another replica's transaction holds are passed
    over, never waited for. SQLite has one writer, and one process (`serve` locks the file)."""
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True)
    return stmt


def one_line(exc: BaseException) -> str:
    """A database error in one line for the log: the driver's message without the statement,
    its parameters or a connection dump (which would show the server's address)."""
    original = getattr(exc, "orig", None) or exc
    text = str(original).splitlines()[0][:160] if str(original) else ""
    return f"{type(original).__name__}: {text}" if text else type(original).__name__
