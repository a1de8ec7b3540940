"""The leader row of the replicas, its fencing epoch, and the replicas' own liveness rows.

Table `leader`, keyed by `name`:
    jobs               which replica runs the periodic jobs (`holder`), where it is reached
                       (`address`) and its `epoch`, one more with each new leader; with the
                       table lease, also until when it holds it
    job:<id>           the last run of a job the leader runs at most once per period (`epoch`
                       counts its runs, `renewed_at` is when the last began, `expires_at` when
                       the next may begin): a new leader does not run it again early
    replica:<token>    one serving process (and its `address`), renewed every few seconds: a
                       claim by a live one is left to it

A replica takes `jobs` by bumping the epoch (after winning the advisory lock, or when the lease
expired), and every write transaction of the leader's jobs first `fence`s: it reads the row
FOR SHARE and refuses to go on when the epoch moved. A takeover's UPDATE waits for those shared
locks, so a deposed leader's transaction either committed before the takeover or is refused.
Callers own the session (and so the transaction).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlmodel import Session

from storage.db import Database
from storage.tables import LeaderRow

JOBS = "jobs"
_JOB = "job:"
_REPLICA = "replica:"
#: The leader's advisory lock ("gpld" in ASCII): not the migrations' ("gpub"), which a new
#: replica takes while the leader holds this one.
ADVISORY_KEY = 0x67706C64
#: Held while a replica starts (it writes the rules' teams and pools): one at a time ("gpst").
STARTUP_KEY = 0x67707374
_NEVER = datetime(2000, 1, 1, tzinfo=UTC)
_TABLE = LeaderRow.__table__  # type: ignore[attr-defined]

Runner = Session | Connection  # a fence runs in an ORM session or a Core transaction


@dataclass(frozen=True)
class Held:
    """The leader as recorded: who, under which epoch, and until when (table lease)."""

    holder: str
    epoch: int
    expires_at: datetime
    renewed_at: datetime
    address: str = ""  # where the other replicas reach its HTTP server ("" when unknown)


def _insert_missing(runner: Runner, name: str, at: datetime, expires_at: datetime) -> None:
    insert = postgresql.insert if runner_dialect(runner) == "postgresql" else sqlite.insert
    runner.execute(
        insert(_TABLE)
        .values(name=name, holder="", epoch=0, expires_at=expires_at, renewed_at=at, address="")
        .on_conflict_do_nothing(index_elements=["name"])
    )


def _rowcount(result: Any) -> int:
    return int(result.rowcount or 0)


def held(session: Session) -> Held | None:
    """Who leads, as the row says (None before any replica ever led)."""
    row = session.get(LeaderRow, JOBS)
    if row is None or not row.holder:
        return None
    return Held(row.holder, row.epoch, row.expires_at, row.renewed_at, row.address)


def take(session: Session, holder: str, *, at: datetime, ttl: timedelta, address: str = "") -> int:
    """Become the leader (the advisory lock is won already): the epoch goes up by one, so
    whatever an earlier leader still has in flight is refused by its fence. `address`: where
    the other replicas reach this one. The new epoch."""
    epoch = _lead(session, holder, at=at, ttl=ttl, address=address, expired_only=False)
    assert epoch is not None  # unconditional: the row is there
    return epoch


def take_expired(
    session: Session, holder: str, *, at: datetime, ttl: timedelta, address: str = ""
) -> int | None:
    """The table lease: become the leader if nobody holds an unexpired lease (compare and set:
    of two replicas trying at once, one gets it). The new epoch, None when it is held."""
    return _lead(session, holder, at=at, ttl=ttl, address=address, expired_only=True)


def _lead(
    session: Session,
    holder: str,
    *,
    at: datetime,
    ttl: timedelta,
    address: str,
    expired_only: bool,
) -> int | None:
    """Write `holder` into the jobs row with the next epoch (only where its lease expired, when
    `expired_only`): that epoch, or None when the row was held."""
    _insert_missing(session, JOBS, at, _NEVER)
    held = [_TABLE.c.name == JOBS]
    if expired_only:
        held.append(_TABLE.c.expires_at < at)
    epoch = session.execute(
        sa.update(_TABLE)
        .where(*held)
        .values(
            epoch=_TABLE.c.epoch + 1,
            holder=holder,
            renewed_at=at,
            expires_at=at + ttl,
            address=address,
        )
        .returning(_TABLE.c.epoch)
    ).scalar_one_or_none()
    return None if epoch is None else int(epoch)


def renew(session: Session, epoch: int, *, at: datetime, ttl: timedelta) -> bool:
    """Still the leader under `epoch`: push the lease's end back. False when another replica
    took over (the epoch moved)."""
    result = session.execute(
        sa.update(_TABLE)
        .where(_TABLE.c.name == JOBS, _TABLE.c.epoch == epoch)
        .values(renewed_at=at, expires_at=at + ttl)
    )
    return _rowcount(result) == 1


def give_up(session: Session, epoch: int, *, at: datetime) -> None:
    """Stop leading under `epoch` (a clean stop): the lease ends now, so a successor need not
    wait for it to expire."""
    session.execute(
        sa.update(_TABLE)
        .where(_TABLE.c.name == JOBS, _TABLE.c.epoch == epoch)
        .values(expires_at=at, holder="", address="")
    )


def fence(runner: Runner, epoch: int) -> bool:
    """Is `epoch` still the leader's? Run first in every write transaction of the leader's
    jobs: the row stays share-locked until the transaction ends, so a takeover (which updates
    it) waits for the transaction, and every later one sees the new epoch and is refused."""
    stmt = sa.select(_TABLE.c.epoch).where(_TABLE.c.name == JOBS)
    if runner_dialect(runner) == "postgresql":
        stmt = stmt.with_for_update(read=True)
    found = runner.execute(stmt).scalar_one_or_none()
    return found is not None and int(found) == epoch


def runner_dialect(runner: Runner) -> str:
    return runner.get_bind().dialect.name if isinstance(runner, Session) else runner.dialect.name


def turn(session: Session, job: str, *, at: datetime, every: timedelta, epoch: int) -> bool:
    """May the leader run `job` now? Yes when its last run by any leader began at least
    `every` ago; the run is then recorded (by `epoch`), so a new leader does not repeat it
    within the period. The row is locked until the caller's transaction ends."""
    name = f"{_JOB}{job}"
    _insert_missing(session, name, _NEVER, _NEVER)
    result = session.execute(
        sa.update(_TABLE)
        .where(_TABLE.c.name == name, _TABLE.c.expires_at <= at)
        .values(
            epoch=_TABLE.c.epoch + 1,
            holder=f"epoch {epoch}",
            renewed_at=at,
            expires_at=at + every,
        )
    )
    return _rowcount(result) == 1


def runs(session: Session, job: str) -> tuple[int, datetime | None]:
    """How many times `job` was run through `turn`, and when the last run began."""
    row = session.get(LeaderRow, f"{_JOB}{job}")
    if row is None or row.epoch == 0:
        return 0, None
    return row.epoch, row.renewed_at


def here(session: Session, token: str, *, at: datetime, ttl: timedelta, address: str = "") -> None:
    """This replica (`token`, reached at `address`) is alive until `at + ttl`."""
    name = f"{_REPLICA}{token}"
    _insert_missing(session, name, at, at + ttl)
    session.execute(
        sa.update(_TABLE)
        .where(_TABLE.c.name == name)
        .values(renewed_at=at, expires_at=at + ttl, holder=token, address=address)
    )


def gone(session: Session, token: str) -> None:
    """This replica stops (a clean stop): its claims are anybody's at once."""
    session.execute(sa.delete(_TABLE).where(_TABLE.c.name == f"{_REPLICA}{token}"))


def alive(session: Session, token: str, *, at: datetime) -> bool:
    """Is the replica whose claims carry `token` still serving?"""
    row = session.get(LeaderRow, f"{_REPLICA}{token}")
    return row is not None and row.expires_at > at


def forget_stopped(session: Session, *, before: datetime) -> int:
    """Drop the liveness rows of replicas that stopped renewing before `before`."""
    result = session.execute(
        sa.delete(_TABLE).where(_TABLE.c.name.like(f"{_REPLICA}%"), _TABLE.c.expires_at < before)
    )
    return _rowcount(result)


@contextmanager
def starting(db: Database) -> Iterator[None]:
    """Replicas starting together write what they load (the rules' teams and pools) one at a
    time, under a PostgreSQL advisory lock; SQLite has one process."""
    if db.dialect != "postgresql":
        yield
        return
    with db.engine.connect() as connection:
        locking = connection.execution_options(isolation_level="AUTOCOMMIT")
        locking.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": STARTUP_KEY})
        try:
            yield
        finally:
            locking.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": STARTUP_KEY})
