"""What the bot acknowledges, it carries out and answers, exactly once.

A listener records each request it accepts (`Inbox.accept`, one short insert keyed for Slack's
retries and replays) and then acks; nothing before the ack calls Slack. Workers take the rows in
arrival order per person, several people at a time: each row is carried out in one unit of
work that also owes its answer to the outbox and marks the row done, so the effects and the
answer commit together or not at all. A crash leaves the row pending, and the next start runs
it; a database that fails is retried with backoff; a bug gives the person a reference instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlmodel import Session

from bot.slack.blocks.kit import Message
from storage import homes, inbox, outbox
from storage.db import Database, one_line
from storage.outbox import OutboxKind, Owed
from storage.tables import InboxRow

log = logging.getLogger(__name__)

#: Attempts at a request the database keeps failing before the person is told it failed.
MAX_ATTEMPTS = 20
#: Immediate reruns of a request whose transaction lost a deadlock or a serialization
#: conflict (nothing of it was kept), before it waits a backoff like any database failure.
CONFLICT_RETRIES = 3
_CONFLICTS = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure
FAILED_TEXT = (
    ":warning: Something went wrong on our side (reference `{reference}`). Nothing of this "
    "request was carried out; an admin can look the reference up in the bot's log."
)


_KINDS = {"command": "a command", "action": "a click", "view": "a form", "event": "an event"}


class Accepted(Enum):
    NEW = "new"  # recorded: a worker carries it out
    REPEATED = "repeated"  # recorded before (a retry or a replay): acknowledged, not run again
    UNAVAILABLE = "unavailable"  # the database could not record it: nothing will happen


@dataclass(frozen=True)
class Answer:
    """What carrying out one request owes the person who sent it."""

    reply: Message | None = None  # through the request's response_url, else by DM
    home: bool = False  # draw their Home tab again
    view: dict[str, Any] | None = None  # a modal to open with the request's trigger_id
    owed: tuple[Owed, ...] = ()  # more the request owes (a report's file), in the same commit


# (the row, what `prepare` looked up outside any transaction) -> the answer
Handler = Callable[[InboxRow, Any], Answer]


def _conflict(exc: OperationalError) -> bool:
    """Did PostgreSQL roll the transaction back to break a deadlock or a serialization
    conflict? (Running it again then usually succeeds.)"""
    return getattr(exc.orig, "sqlstate", None) in _CONFLICTS


def request_key(body: Mapping[str, Any]) -> str:
    """The idempotency key of a request from Slack: its event_id, else a hash of its body (a
    retry or a replay repeats the body byte for byte; two clicks differ in trigger and time)."""
    event_id = body.get("event_id")
    if isinstance(event_id, str) and event_id:
        return f"event:{event_id}"[:96]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return "body:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class _Queues:
    """Rows waiting in memory: per person in arrival order, people ready in turn."""

    by_actor: dict[str, deque[int]] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    busy: set[str] = field(default_factory=set)
    queued: set[int] = field(default_factory=set)


class Inbox:
    """Records accepted requests and carries them out on `workers` threads."""

    def __init__(
        self,
        db: Database,
        clock: Callable[[], datetime],
        handlers: Mapping[str, Handler],
        *,
        prepare: Callable[[InboxRow], Any] = lambda row: None,
        open_view: Callable[[str, dict[str, Any]], None] | None = None,
        delivered: Callable[[list[int]], None] = lambda ids: None,
        claimant: str | None = None,
        workers: int = 4,
    ) -> None:
        self.db, self.clock = db, clock
        self.handlers = dict(handlers)
        self.prepare = prepare
        self.open_view = open_view
        # Everything a request owed (its answer, the DMs and cards of its decision) is claimed
        # for `claimant`, the deliverer `delivered` hands it to, in the request's own commit.
        self.delivered = delivered
        self.claimant = claimant
        self.size = max(1, workers)
        self._queues = _Queues()
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._running = 0
        self._accepted: dict[int, InboxRow] = {}  # rows this process recorded, until taken
        #: With replicas: a row another one acknowledged less than this ago is left to it
        #: (it is carrying it out); None when this process is alone.
        self.handoff: timedelta | None = None

    # the ack path

    def accept(self, *, key: str, kind: str, actor: str, payload: Mapping[str, Any]) -> Accepted:
        """Record one request (before its ack) and queue it; never raises."""
        try:
            with self.db.brief() as session:
                row_id = inbox.accept(
                    session, key=key, kind=kind, actor=actor, payload=payload, at=self.clock()
                )
        except SQLAlchemyError as exc:
            log.warning("%s from %s not recorded: %s", _KINDS.get(kind, kind), actor, one_line(exc))
            return Accepted.UNAVAILABLE
        if row_id is None:
            log.info(
                "%s from %s acknowledged again, not run again (Slack's retry or a replay; key %s)",
                _KINDS.get(kind, kind),
                actor,
                key,
            )
            return Accepted.REPEATED
        # What the worker's look-ups need, so it does not read back what was just written.
        seen = InboxRow(id=row_id, key=key, kind=kind, actor=actor, payload=dict(payload))
        with self._changed:
            self._accepted[row_id] = seen
        self.submit(row_id, actor)
        return Accepted.NEW

    # the workers

    def submit(self, row_id: int, actor: str) -> None:
        with self._changed:
            if row_id in self._queues.queued:
                return
            self._start_locked()
            q = self._queues
            q.queued.add(row_id)
            q.by_actor.setdefault(actor, deque()).append(row_id)
            if actor not in q.busy and actor not in q.ready:
                q.ready.append(actor)
            self._changed.notify()

    def run_due(self) -> int:
        """Queue every pending row whose attempt has come (start-up, and the periodic job that
        retries what the database refused); how many were queued."""
        try:
            now = self.clock()
            before = now - self.handoff if self.handoff is not None else None
            with self.db.read() as session:
                due = inbox.due(session, now, received_before=before)
        except SQLAlchemyError as exc:
            log.warning("the inbox cannot be read (%s); the next pass retries", one_line(exc))
            return 0
        for row_id, actor in due:
            self.submit(row_id, actor)
        return len(due)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until nothing is queued or running (tests, shutdown)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: not self._queues.queued and self._running == 0, timeout
            )

    def stop(self, timeout: float = 10.0) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _start_locked(self) -> None:
        if self._threads or self._stopping:
            return
        for n in range(self.size):
            thread = threading.Thread(target=self._work, name=f"gpubot-inbox-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        q = self._queues
        while True:
            with self._changed:
                while not q.ready and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    return
                actor = q.ready.popleft()
                q.busy.add(actor)
                row_id = q.by_actor[actor].popleft()
                self._running += 1
            try:
                self.carry_out(row_id)
            except Exception:  # carry_out handles its own; this keeps the worker alive regardless
                log.exception("inbox row %s: unexpected failure", row_id)
            finally:
                with self._changed:
                    self._running -= 1
                    q.queued.discard(row_id)
                    q.busy.discard(actor)
                    if q.by_actor.get(actor):
                        q.ready.append(actor)
                    else:
                        q.by_actor.pop(actor, None)
                    self._changed.notify_all()

    # one request

    def carry_out(self, row_id: int) -> None:
        """Run one recorded request to its end: done and answered, retried later, or failed."""
        try:
            with self._changed:
                found = self._accepted.pop(row_id, None)
            if found is None:  # from an earlier run, or a retry: as the database has it
                with self.db.read() as session:
                    found = session.get(InboxRow, row_id)
            if found is None or found.state != inbox.PENDING:
                return
            looked_up = self.prepare(found)
            row = found
            done = self._unit(row, looked_up)
            if done is None:
                return  # carried out meanwhile
            answer, owed, trigger = done
        except (OperationalError, InterfaceError) as exc:  # the database failed: try again
            self._retry_or_give_up(row_id, exc)
            return
        except Exception as exc:  # a bug: the person hears of it, with a reference
            self._failed(row_id, exc)
            return
        if answer.view is not None and self.open_view is not None and trigger:
            self._open(row_id, str(trigger), answer.view)
        self.delivered(owed)

    def _unit(self, row: InboxRow, looked_up: Any) -> tuple[Answer, list[int], Any] | None:
        """Carry the row out in one unit of work: (answer, rows owed, trigger), None when it
        was carried out meanwhile. A deadlock or serialization failure (PostgreSQL, several
        workers or replicas deciding at once) rolled everything back: it runs again at once."""
        assert row.id is not None
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                with self.db.unit() as session:
                    if not inbox.take(session, row.id, at=self.clock()):
                        return None
                    answer = self.handlers[row.kind](row, looked_up)
                    self._owe(session, row, answer)
                    return answer, self._claim(session), row.payload.get("trigger_id")
            except OperationalError as exc:
                if attempt == CONFLICT_RETRIES or not _conflict(exc):
                    raise
                log.info("inbox row %s: %s; running it again", row.id, one_line(exc))
        raise AssertionError("unreachable")  # pragma: no cover

    def _owe(self, session: Session, row: InboxRow, answer: Answer) -> None:
        subject, at = f"inbox:{row.id}", self.clock()
        if row.kind == "view":  # a form, often opened from the Home: redrawn with the answer
            homes.hurry(session, row.actor)
        if answer.reply is not None:
            data: dict[str, Any] = answer.reply.as_kwargs()
            url = row.payload.get("response_url")
            if isinstance(url, str) and url:
                data["response_url"] = url
            outbox.owe(session, Owed(OutboxKind.REPLY, subject, row.actor, data), at=at)
        if answer.home:
            homes.owe_home(session, row.actor, at=at, subject=subject)
        for owed in answer.owed:
            outbox.owe(session, owed, at=at)

    def _claim(self, session: Session) -> list[int]:
        self.db.settle(session)  # the Home tabs the request's changes owe go out with it
        owed = outbox.owed_in(session)
        if self.claimant is not None:
            outbox.claim_owed(session, owed, at=self.clock(), by=self.claimant)
        return owed

    def _open(self, row_id: int, trigger: str, view: dict[str, Any]) -> None:
        assert self.open_view is not None
        try:
            self.open_view(trigger, view)
        except Exception as exc:  # the form is a convenience; say what to type instead
            log.warning("inbox row %s: the form did not open (%s)", row_id, exc)
            self._tell(
                row_id,
                Message(
                    "The form did not open.",
                    [
                        {
                            "type": "section",
                            "text": {
                                "type": "mrkdwn",
                                "text": "The form did not open (Slack did not answer in time). "
                                "Type the request instead, e.g. "
                                "`/gpu borrow 2 a100 for 4h because training`.",
                            },
                        }
                    ],
                ),
            )

    def _retry_or_give_up(self, row_id: int, exc: SQLAlchemyError) -> None:
        try:
            with self.db.write() as session:
                row = session.get(InboxRow, row_id)
                if row is not None and row.attempts + 1 >= MAX_ATTEMPTS:
                    self._fail_in(session, row_id, exc)
                    return
                retry = inbox.retry_later(session, row_id, at=self.clock(), error=one_line(exc))
        except SQLAlchemyError as again:
            log.warning("inbox row %s waits for the database (%s)", row_id, one_line(again))
            return
        log.warning(
            "inbox row %s: the database failed (%s); retrying at %s",
            row_id,
            one_line(exc),
            retry.isoformat(),
        )

    def _failed(self, row_id: int, exc: Exception) -> None:
        try:
            with self.db.write() as session:
                ids = self._fail_in(session, row_id, exc)
        except SQLAlchemyError as again:
            log.warning("inbox row %s waits for the database (%s)", row_id, one_line(again))
            return
        self.delivered(ids)

    def _fail_in(self, session: Session, row_id: int, exc: BaseException) -> list[int]:
        reference = uuid.uuid4().hex[:8]
        log.error("inbox row %s failed (reference %s)", row_id, reference, exc_info=exc)
        row = session.get(InboxRow, row_id)
        if row is None or row.state != inbox.PENDING:
            return []
        inbox.failed(session, row_id, at=self.clock(), error=f"{reference}: {one_line(exc)}")
        text = FAILED_TEXT.format(reference=reference)
        reply = Message(text, [{"type": "section", "text": {"type": "mrkdwn", "text": text}}])
        self._owe(session, row, Answer(reply=reply))
        return self._claim(session)

    def _tell(self, row_id: int, reply: Message) -> None:
        try:
            with self.db.write() as session:
                row = session.get(InboxRow, row_id)
                if row is not None:
                    self._owe(session, row, Answer(reply=reply))
                ids = self._claim(session)
        except SQLAlchemyError as exc:
            log.warning("inbox row %s: could not owe a note (%s)", row_id, one_line(exc))
            return
        self.delivered(ids)
