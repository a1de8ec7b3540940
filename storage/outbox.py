"""The transactional outbox: owe a message inside a decision's transaction, then deliver it.

`owe` runs in the caller's transaction. `due` hands the delivery worker what is ready, oldest
first. A row is `claim`ed (committed) before it goes to Slack, with its next attempt already
pushed back, so a delivery whose outcome cannot be recorded is never re-sent in a loop;
`delivered`, `failed` and `dropped` record the outcome. A row claimed by a process that is gone
is in doubt: the deliverer checks before it sends it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from storage.db import skip_locked
from storage.tables import OutboxRow

PENDING, SENDING, DELIVERED, DROPPED, FAILED = (
    "pending",
    "sending",
    "delivered",
    "dropped",
    "failed",
)
_MAX_BACKOFF = timedelta(minutes=5)
#: `claimed_by` of a row whose last send may have reached Slack without an answer: whoever
#: takes it next looks for the message before sending it again.
IN_DOUBT = "?"
#: How long a send in doubt is left before it is looked for: a slow Slack may still be
#: posting it well after the client gave up waiting.
IN_DOUBT_WAIT = timedelta(minutes=1)
_OWED = "gpubot_owed"  # session.info: the rows owed in the session's transaction
#: Attempts before a message is given up (about two hours of a Slack outage at 5-minute backoff).
MAX_ATTEMPTS = 30


class OutboxKind(StrEnum):
    """What an outbox row owes (the Slack adapter draws each kind its own way)."""

    REPLY = "reply"  # the answer to a command or a click, drawn when it was carried out
    HOME = "home"  # a person's Home tab, drawn when it is published
    APPROVAL_CARD = "approval_card"  # a request waits: to the approval channel or approvers
    APPROVAL_REMINDER = "approval_reminder"  # a reply in the thread of a posted approval card
    CARD_SETTLED = "card_settled"  # redraw every approval card of a request in place
    REQUEST_DECIDED = "request_decided"  # tell the requester what a person decided
    LEASE_GRANTED = "lease_granted"  # the holder's grant DM
    LEASE_ENDED = "lease_ended"  # someone else ended the holder's lease
    LEASE_CLOSED = "lease_closed"  # redraw an ended lease's grant and warning DMs in place
    LEASE_REDRAWN = "lease_redrawn"  # redraw a lease's grant DM (its thread's parent) in place
    LEASE_WARNING = "lease_warning"  # expiry, idle, preempt or unhealthy, before anything is taken
    LEASE_RECLAIMED = "lease_reclaimed"  # the lease was reclaimed, and why
    RECALL_WITHDRAWN = "recall_withdrawn"  # the lease warned of preemption stays
    UNRESERVED_USE = "unreserved_use"  # a process runs on a GPU no lease covers
    ADMIN_NOTICE = "admin_notice"  # a line for each admin (one message per line, as before)
    ADMIN_DIGEST = "admin_digest"  # the lines a sweep owes one admin, in one message
    NOTICE = "notice"  # a line for one person
    DIGEST = "digest"  # a scheduled usage digest, to a channel or a person, once per period
    REPORT_FILE = "report_file"  # a report drawn as a chart or a CSV file, posted where asked


def backoff(attempts: int) -> timedelta:
    """The wait after the `attempts`-th attempt: 2 s, 4 s, 8 s ... at most 5 minutes."""
    return min(_MAX_BACKOFF, timedelta(seconds=2 ** min(max(attempts, 1), 10)))


_TABLE = OutboxRow.__table__  # type: ignore[attr-defined]
# Built once: every request's answer goes through these.
_CLAIM_OWED = (
    sa.update(_TABLE)
    .where(_TABLE.c.id.in_(sa.bindparam("ids", expanding=True)), _TABLE.c.state == PENDING)
    .values(
        state=SENDING,
        attempts=_TABLE.c.attempts + 1,
        claimed_at=sa.bindparam("at"),
        claimed_by=sa.bindparam("by"),
        next_attempt_at=sa.bindparam("next"),
    )
)
_DELIVERED = (
    sa.update(_TABLE)
    .where(_TABLE.c.id == sa.bindparam("row_id"))
    .values(
        state=DELIVERED,
        delivered_at=sa.bindparam("at"),
        channel=sa.bindparam("channel"),
        ts=sa.bindparam("ts"),
    )
)


@dataclass(frozen=True)
class Owed:
    """One message someone is owed: its kind, what it is about, and to whom."""

    kind: OutboxKind
    subject: str
    recipient: str
    data: Mapping[str, Any]


@overload
def owe(
    session: Session,
    message: Owed,
    *,
    at: datetime,
    after: timedelta | None = None,
    key: None = None,
) -> OutboxRow: ...


@overload
def owe(
    session: Session, message: Owed, *, at: datetime, after: timedelta | None = None, key: str
) -> OutboxRow | None: ...


def owe(
    session: Session,
    message: Owed,
    *,
    at: datetime,
    after: timedelta | None = None,
    key: str | None = None,
) -> OutboxRow | None:
    """Owe a message in the caller's transaction. `after`: not before then, and not sent at
    once with what the request owed (a cosmetic redraw that later changes may fold into).
    `key`: the message is owed once under it; None when a row with that key exists already."""
    row = OutboxRow(
        created_at=at,
        kind=str(message.kind),
        subject=message.subject,
        recipient=message.recipient,
        data=dict(message.data),
        next_attempt_at=at + after if after else at,
        dedupe_key=key,
    )
    if key is None:
        session.add(row)
        session.flush()
        row_id = row.id
    else:
        row_id = _insert_once(session, row)
        if row_id is None:
            return None
        row = session.get_one(OutboxRow, row_id)
    if not after:
        session.info.setdefault(_OWED, []).append(row_id)
    return row


def _insert_once(session: Session, row: OutboxRow) -> int | None:
    """Insert `row` unless its key is taken: the database decides (a racing insert of the
    same key waits for the first one's commit, then adds nothing). Its id, None when taken."""
    values = row.model_dump(exclude={"id"})
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = (
        insert(_TABLE)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["dedupe_key"])
        .returning(_TABLE.c.id)
    )
    found = session.execute(stmt).scalar_one_or_none()
    return None if found is None else int(found)


def keyed(session: Session, key: str) -> OutboxRow | None:
    """The row owed under `key` (None: nothing was owed under it)."""
    return session.exec(select(OutboxRow).where(OutboxRow.dedupe_key == key)).first()


def waiting(
    session: Session, kind: str, recipient: str, *, not_before: datetime
) -> OutboxRow | None:
    """The newest row of `kind` for `recipient` never tried and not due before `not_before`:
    what it says may still grow. It is locked until the caller's transaction ends (on
    PostgreSQL; SQLite has one writer at a time): a deliverer's claim of it waits for that
    commit, and the row is drawn after its claim, so a line added is never left out."""
    stmt = (
        select(OutboxRow)
        .where(
            OutboxRow.kind == kind,
            OutboxRow.recipient == recipient,
            OutboxRow.state == PENDING,
            OutboxRow.attempts == 0,
            col(OutboxRow.next_attempt_at) > not_before,
        )
        .order_by(col(OutboxRow.id).desc())
        .limit(1)  # the ORM would load every match, and a pass grows many digests
        .with_for_update()
    )
    return session.exec(stmt).first()


def untaken(session: Session, subject: str, kind: str) -> bool:
    """Whether a row of `kind` about `subject` waits that no deliverer has claimed yet; such
    rows are locked until the caller's transaction ends (on PostgreSQL), so a claim waits for
    that commit and the row, drawn after its claim, shows what it committed."""
    stmt = (
        select(OutboxRow.id)
        .where(OutboxRow.subject == subject, OutboxRow.kind == kind, OutboxRow.state == PENDING)
        .with_for_update()
    )
    return bool(session.exec(stmt).all())


def latest_posted(session: Session, recipient: str, kinds: Sequence[str]) -> OutboxRow | None:
    """The newest message delivered to `recipient` among `kinds` (by its Slack ts)."""
    stmt = (
        select(OutboxRow)
        .where(
            OutboxRow.recipient == recipient,
            col(OutboxRow.kind).in_(list(kinds)),
            OutboxRow.state == DELIVERED,
            col(OutboxRow.ts).is_not(None),
        )
        .order_by(col(OutboxRow.ts).desc(), col(OutboxRow.id).desc())
    )
    return session.exec(stmt).first()


def delivered_as(session: Session, kind: str, channel: str, ts: str) -> list[OutboxRow]:
    """The rows of `kind` delivered as the message (channel, ts), oldest first: a message
    updated in place by later rows is recorded under each of them."""
    stmt = (
        select(OutboxRow)
        .where(
            OutboxRow.kind == kind,
            OutboxRow.channel == channel,
            OutboxRow.ts == ts,
            OutboxRow.state == DELIVERED,
        )
        .order_by(col(OutboxRow.id))
    )
    return list(session.exec(stmt).all())


def get(session: Session, row_id: int) -> OutboxRow | None:
    """One owed message (None: there is no such row)."""
    return session.get(OutboxRow, row_id)


def any_about(session: Session, subject: str, kind: str, states: Sequence[str]) -> bool:
    """Whether a message of `kind` about `subject` is in one of `states`."""
    stmt = select(OutboxRow.id).where(
        OutboxRow.subject == subject, OutboxRow.kind == kind, col(OutboxRow.state).in_(states)
    )
    return session.exec(stmt).first() is not None


def owed_in(session: Session) -> list[int]:
    """The rows owed so far in this session's transaction, in the order they were owed."""
    return list(session.info.get(_OWED, []))


def claim_owed(session: Session, row_ids: list[int], *, at: datetime, by: str) -> None:
    """Claim rows owed in this very transaction for the deliverer `by`, which sends them as
    soon as it commits: no other deliverer takes them before their first backoff has passed."""
    if row_ids:
        session.execute(_CLAIM_OWED, {"ids": row_ids, "at": at, "by": by, "next": at + backoff(1)})


def due(session: Session, now: datetime, limit: int = 50) -> list[OutboxRow]:
    """Rows to send whose next attempt has come, in the order they were owed: pending ones,
    and claimed ones whose outcome was never recorded. On PostgreSQL a row some transaction
    holds (being owed, or claimed by another replica) is passed over, not waited for."""
    stmt = (
        select(OutboxRow)
        .where(col(OutboxRow.state).in_([PENDING, SENDING]), col(OutboxRow.next_attempt_at) <= now)
        .order_by(col(OutboxRow.id))
        .limit(limit)
    )
    return list(session.exec(skip_locked(session, stmt)).all())


def claim(session: Session, row: OutboxRow, *, at: datetime, by: str) -> bool:
    """Take `row` for one attempt: count it and push its next attempt back before it is sent.
    False when someone else took it first (its state or schedule moved since it was read).
    A claim racing another replica's waits only for that one's short claim transaction (or
    for a digest's growing line to commit), then finds the row taken, or drawn complete."""
    assert row.id is not None
    attempts = row.attempts + 1
    result = session.execute(
        sa.update(OutboxRow)
        .where(
            col(OutboxRow.id) == row.id,
            col(OutboxRow.state).in_([PENDING, SENDING]),
            col(OutboxRow.attempts) == row.attempts,
        )
        .values(
            state=SENDING,
            attempts=attempts,
            claimed_at=at,
            claimed_by=by,
            next_attempt_at=at + backoff(attempts),
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def delivered(
    session: Session,
    row_id: int,
    *,
    at: datetime,
    channel: str | None,
    ts: str | None,
    note: Mapping[str, Any] | None = None,
) -> None:
    """The row landed at (channel, ts); `note`: what its drawing was, kept in its data."""
    session.execute(_DELIVERED, {"row_id": row_id, "at": at, "channel": channel, "ts": ts})
    if note:
        row = session.get(OutboxRow, row_id)
        if row is not None:
            row.data = {**row.data, **note}
            session.add(row)


def failed(
    session: Session,
    row_id: int,
    *,
    at: datetime,
    error: str,
    retry_after: timedelta | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    in_doubt: bool = False,
) -> datetime | None:
    """A claimed row was not delivered: pending again at its backoff (or when Slack said to
    retry), or given up after `max_attempts`; the next attempt, None when given up. A row
    `in_doubt` (the send may have arrived) stays claimed, marked for a look before a resend."""
    row = session.get(OutboxRow, row_id)
    assert row is not None
    row.last_error = error[:500]
    if row.attempts >= max_attempts:
        row.state, row.delivered_at = FAILED, at
        session.add(row)
        return None
    if in_doubt:
        row.state, row.claimed_by = SENDING, IN_DOUBT
        retry_after = max(retry_after or IN_DOUBT_WAIT, IN_DOUBT_WAIT)
    else:
        row.state = PENDING
    later = at + retry_after if retry_after is not None else row.next_attempt_at
    row.next_attempt_at = max(row.next_attempt_at, later)
    session.add(row)
    return row.next_attempt_at


def note(session: Session, row_id: int, data: Mapping[str, Any]) -> None:
    """Keep `data` in a row's data while it is on its way (a file's id before it is shared,
    so a share in doubt can be looked for)."""
    row = session.get(OutboxRow, row_id)
    if row is not None:
        row.data = {**row.data, **data}
        session.add(row)


def dropped(session: Session, row_id: int, *, at: datetime, why: str) -> None:
    """Nothing is left to deliver (e.g. a card update for a card that was never posted)."""
    row = session.get(OutboxRow, row_id)
    assert row is not None
    row.state, row.delivered_at, row.last_error = DROPPED, at, why[:500]
    session.add(row)


def landed(session: Session, subject: str, kinds: Sequence[str]) -> list[OutboxRow]:
    """Where the messages of these kinds about `subject` landed (delivered ones only)."""
    stmt = (
        select(OutboxRow)
        .where(
            OutboxRow.subject == subject,
            col(OutboxRow.kind).in_(list(kinds)),
            OutboxRow.state == DELIVERED,
        )
        .order_by(col(OutboxRow.id))
    )
    return list(session.exec(stmt).all())


def owed_about(session: Session, subject: str) -> list[OutboxRow]:
    stmt = select(OutboxRow).where(OutboxRow.subject == subject).order_by(col(OutboxRow.id))
    return list(session.exec(stmt).all())


def counts(session: Session) -> dict[str, int]:
    """Rows by state (for health and metrics)."""
    stmt = select(OutboxRow.state, sa.func.count()).group_by(col(OutboxRow.state))
    return {str(state): int(n) for state, n in session.exec(stmt).all()}
