"""Delivering the outbox to Slack: render, claim, send, record where it landed, retry what failed.

No database transaction is open while Slack is called. A row is claimed (committed, its next
attempt already pushed back) before it is sent, so a failure of any kind, the bookkeeping's
included, waits out a backoff instead of sending again at once. An outcome that could not be
recorded is kept in memory and recorded later, never re-sent. A row claimed by a process that
is gone may have reached Slack: a message is looked up in its conversation by the outbox id it
carries in its metadata before it is sent again; a reply through a response_url, which cannot
be looked up, is sent again (at least once) and counted as in doubt. A redraw in place and an
admin digest are drawn only once claimed, so nothing committed before the claim is drawn over.

Rows go out in the order they were owed; a failure holds back later rows for the same
recipient in this pass, so nobody reads a "denied" before the card it settles. How one row
reaches Slack is bot.slack.sending; how its outcome is written down, bot.slack.recording.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from slack_sdk import WebClient
from sqlalchemy.exc import SQLAlchemyError

from bot.slack.recording import Recorder, Report, summarise
from bot.slack.sending import (
    UPDATES,
    Dropped,
    NotSent,
    Outcome,
    Render,
    Rendered,
    Sender,
    Sent,
    has_live_url,
    home_of,
)
from storage import outbox
from storage.db import Database, one_line
from storage.outbox import OutboxKind
from storage.tables import OutboxRow

log = logging.getLogger(__name__)

_DEFERRED = object()  # not yet: a card update waiting for its card, a reply for its parent
_UNSENT = (outbox.PENDING, outbox.SENDING)
EXPRESS_BATCH = 50  # rows the express thread sends before it records their outcomes at once


def drawn_after_claim(row: OutboxRow) -> bool:
    """Is `row` drawn only once it is claimed? A redraw in place, and an admin digest that
    may still grow: whatever committed before the claim is in what is sent, and whatever
    commits after it finds the row taken and owes another."""
    return row.kind in UPDATES or row.kind == OutboxKind.ADMIN_DIGEST


class Deliverer:
    """Sends what the outbox owes: a pass over what is due (the scheduler calls `run`), or the
    rows an inbox worker just owed (`deliver`), whoever gets to a row first."""

    def __init__(
        self,
        db: Database,
        client: WebClient,
        render: Render,
        clock: Callable[[], datetime],
        *,
        max_attempts: int = outbox.MAX_ATTEMPTS,
    ) -> None:
        self.db = db
        self.sender = Sender(client, self._note)
        self.render = render
        self.clock = clock
        self.recorder = Recorder(max_attempts)
        self.token = uuid.uuid4().hex[:12]  # this process's claims
        #: Is the deliverer with this token still serving? A replica's claim is left to it
        #: while it is; one process alone never meets a live claim but its own.
        self.alive: Callable[[str], bool] = lambda token: token == self.token
        self._inflight: set[int] = set()  # handed to the express thread, not done with yet
        self._inflight_lock = threading.Lock()
        self._pass = threading.Lock()  # one pass at a time, whoever asks
        self._wanted = threading.Event()
        self._express: queue.SimpleQueue[list[int] | None] = queue.SimpleQueue()
        self._express_thread: threading.Thread | None = None
        self._express_lock = threading.Lock()

    def _note(self, row_id: int, data: Mapping[str, Any]) -> None:
        """Keep what a send in flight must leave behind (a file's id before its share)."""
        with self.db.write() as session:
            outbox.note(session, row_id, data)

    def express(self, row_ids: list[int]) -> None:
        """Send these rows at once on the express thread: what a request just owed (its answer,
        the DMs and cards of its decision), claimed for this deliverer in the request's own
        commit. The inbox's workers never wait on Slack; the pass leaves these rows alone."""
        if not row_ids:
            return
        with self._inflight_lock:
            self._inflight.update(row_ids)
        with self._express_lock:
            if self._express_thread is None:
                self._express_thread = threading.Thread(
                    target=self._run_express, name="gpubot-express", daemon=True
                )
                self._express_thread.start()
        self._express.put(list(row_ids))

    def _run_express(self) -> None:
        while True:
            ids = self._express.get()
            stop = ids is None
            batch = list(ids or [])
            # What piled up meanwhile goes in the same batch: one record for all of it.
            while not stop and len(batch) < EXPRESS_BATCH and not self._express.empty():
                more = self._express.get()
                stop = more is None
                batch += more or []
            try:
                self.deliver(batch)
            except Exception:  # the pass picks the rows up later; the thread must go on
                log.exception("express delivery of %s failed", batch)
            if stop:
                return

    def idle(self, timeout: float = 30.0) -> bool:
        """Wait until the express thread has sent (or failed) all it was given."""
        deadline = time.monotonic() + timeout
        while True:
            with self._inflight_lock:
                busy = bool(self._inflight)
            if not busy or time.monotonic() > deadline:
                return not busy
            time.sleep(0.01)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the express thread once it has sent what it was given."""
        with self._express_lock:
            thread, self._express_thread = self._express_thread, None
        if thread is not None:
            self._express.put(None)
            thread.join(timeout)

    def run(self) -> None:
        """The scheduled job: passes until nothing new was owed while one ran."""
        while True:
            self._wanted.clear()
            self.deliver_due()
            if not self._wanted.is_set():
                return

    def record_kept(self) -> Report:
        """Record the outcomes the database did not take when they came in. Every replica runs
        this for its own sends: no other replica touches a row while this one's claim on it
        is live, and the delivery pass runs on the leader only."""
        report = Report()
        ids = self.recorder.kept_ids()
        if not ids:
            return report
        try:
            with self.db.read() as session:
                rows = [r for r in (session.get(OutboxRow, i) for i in ids) if r is not None]
        except SQLAlchemyError as exc:
            report.errors.append(f"reading the outbox: {one_line(exc)}")
            return report
        kept = [(row, self.recorder.kept(row.id or 0)) for row in rows]
        self._record_all([(row, o) for row, o in kept if o is not None], report)
        return report

    def want(self) -> bool:
        """A decision owes something: True when no pass is running (so start one now);
        a running pass sees the wish and goes round once more."""
        self._wanted.set()
        return not self._pass.locked()

    def deliver_due(self, limit: int = 100) -> Report:
        report = Report()
        with self._pass:
            try:
                with self.db.read() as session:
                    rows = outbox.due(session, self.clock(), limit)
            except SQLAlchemyError as exc:
                report.errors.append(f"reading the outbox: {one_line(exc)}")
                log.warning("the outbox cannot be read (%s); next pass retries", one_line(exc))
                return report
            self._send_all(rows, report)
        summarise(report)
        return report

    def deliver(self, row_ids: Iterable[int]) -> Report:
        """Send these rows now if still owed: claimed for this deliverer already (what a request
        just owed), or pending and due."""
        report = Report()
        ids = list(row_ids)
        try:
            if ids:
                self._deliver_rows(ids, report)
        finally:
            with self._inflight_lock:
                self._inflight.difference_update(ids)
        summarise(report)
        return report

    def _deliver_rows(self, ids: list[int], report: Report) -> None:
        try:
            with self.db.read() as session:
                rows = [r for r in (session.get(OutboxRow, i) for i in ids) if r is not None]
        except SQLAlchemyError as exc:
            report.errors.append(f"reading the outbox: {one_line(exc)}")
            return
        now = self.clock()
        sent: list[tuple[OutboxRow, Outcome]] = []
        for row in rows:
            if (row.kind in UPDATES or home_of(row)) and sent:
                # The message it updates (or replies to) may be among those just sent: on
                # record first.
                self._record_all(sent, report)
                sent = []
            # A reply on a response_url cannot be looked up after a crash: its outcome is
            # recorded at once, so a crash can repeat at most the one in flight. Messages,
            # which can be looked up, are recorded together after the batch.
            later = None if has_live_url(row, now) else sent
            mine = row.state == outbox.SENDING and row.claimed_by == self.token
            if mine:
                self._attempt(row, report, claimed=True, later=later)
            elif row.state == outbox.PENDING and row.next_attempt_at <= now:
                self._attempt(row, report, later=later)
        self._record_all(sent, report)

    def _send_all(self, rows: list[OutboxRow], report: Report) -> None:
        blocked: set[str] = set()
        with self._inflight_lock:
            rows = [r for r in rows if r.id not in self._inflight]  # the express thread's
        newest_home = {r.recipient: r.id for r in rows if r.kind == OutboxKind.HOME}
        for row in rows:
            assert row.id is not None
            if report.database_down:  # every claim would wait out the database, one by one
                report.deferred += 1
                continue
            if row.recipient in blocked or self._claimed_elsewhere(row):
                report.deferred += 1  # (another replica is sending it; it records the outcome)
                continue
            if row.kind == OutboxKind.HOME and newest_home.get(row.recipient) != row.id:
                self._record(row, Dropped("a newer Home tab replaces it"), report)
                continue
            if not self._attempt(row, report):
                blocked.add(row.recipient)

    def _attempt(
        self,
        row: OutboxRow,
        report: Report,
        *,
        claimed: bool = False,
        later: list[tuple[OutboxRow, Outcome]] | None = None,
    ) -> bool:
        """One row: False when it did not get through (later rows for its recipient wait).
        `claimed`: this deliverer holds the row's claim already (made in the owing commit);
        `later`: the outcome of a send goes there, to be recorded with others."""
        assert row.id is not None
        kept = self.recorder.kept(row.id)
        if kept is not None:  # sent (or not) earlier in this process; only the record is late
            return self._record(row, kept, report)
        late = drawn_after_claim(row)
        prepared = self._waits(row) if late else self._prepare_or_fail(row)
        if prepared is _DEFERRED:
            report.deferred += 1
            return True
        if isinstance(prepared, Dropped):
            return self._record(row, prepared, report)
        in_doubt = self._in_doubt(row, claimed=claimed)
        landed = self._landed(row, prepared) if in_doubt else None
        if landed is not None:
            return self._record(row, landed, report)
        if not claimed:
            taken = self._claim(row, report)
            if taken is not True:
                return taken is None  # None: another pass or worker took it
        if late:
            prepared = self._prepare_claimed(row)
            if isinstance(prepared, Dropped):
                return self._record(row, prepared, report)
        if in_doubt:
            report.in_doubt += 1
            log.info(
                "outbox row %s (%s): claimed before a restart or a timeout and not found in "
                "Slack; sending it (now, or again)",
                row.id,
                row.kind,
            )
        return self._send(row, prepared, report, later)

    def _waits(self, row: OutboxRow) -> Any:
        """_DEFERRED while a message a redraw updates is still on its way, else None (a row
        drawn only once it is claimed)."""
        if row.kind not in UPDATES:
            return None
        with self.db.read() as session:
            about = outbox.owed_about(session, row.subject)
        waiting = [r for r in about if r.kind in UPDATES[row.kind] and r.state in _UNSENT]
        return _DEFERRED if waiting else None

    def _prepare_claimed(self, row: OutboxRow) -> Any:
        """What to send for a row drawn once claimed: it waits its backoff when a message it
        updates was owed between the look and the claim."""
        prepared = self._prepare_or_fail(row)
        if prepared is _DEFERRED:
            return NotSent("a message it updates is still on its way")
        return prepared

    def _prepare_or_fail(self, row: OutboxRow) -> Any:
        """What to send (`_prepare`), or a NotSent when drawing it failed."""
        try:
            return self._prepare(row)
        except Exception as exc:  # a rendering bug: the row waits its backoff, the rest goes on
            log.exception("rendering outbox row %s (%s) failed", row.id, row.kind)
            return NotSent(f"rendering failed: {type(exc).__name__}: {exc}")

    def _claimed_elsewhere(self, row: OutboxRow) -> bool:
        """Is the row claimed by another replica that is still serving? Only a claim by one
        that stopped is in doubt (and looked for in Slack before it is sent again)."""
        by = row.claimed_by
        if row.state != outbox.SENDING or by in ("", self.token, outbox.IN_DOUBT):
            return False
        return self.alive(by)

    def _in_doubt(self, row: OutboxRow, *, claimed: bool) -> bool:
        """Was the row claimed by a process that is gone, or sent without an answer? It may
        have reached Slack."""
        gone = not claimed and row.state == outbox.SENDING and row.claimed_by != self.token
        return gone or row.claimed_by == outbox.IN_DOUBT

    def _landed(self, row: OutboxRow, prepared: Any) -> Sent | None:
        """Where a message in doubt landed, if Slack has it (nothing to look for when it
        cannot be drawn)."""
        if isinstance(prepared, NotSent):
            return None
        return self.sender.landed(row, self.clock(), prepared)

    def _send(
        self,
        row: OutboxRow,
        prepared: Any,
        report: Report,
        later: list[tuple[OutboxRow, Outcome]] | None,
    ) -> bool:
        if isinstance(prepared, NotSent):
            outcome: Outcome = prepared
        else:
            outcome = self.sender.send(row, prepared, self.clock())
        if later is not None:
            later.append((row, outcome))
            return not isinstance(outcome, NotSent)
        return self._record(row, outcome, report)

    def _claim(self, row: OutboxRow, report: Report) -> bool | None:
        """Take the row for one attempt: True; False when the database refused (nothing is
        sent); None when someone else took it meanwhile."""
        try:
            with self.db.write() as session:
                taken = outbox.claim(session, row, at=self.clock(), by=self.token)
        except SQLAlchemyError as exc:
            report.failed += 1
            report.database_down = True
            report.errors.append(f"{row.kind} {row.subject}: claim: {one_line(exc)}")
            log.warning("outbox row %s not sent: cannot claim it (%s)", row.id, one_line(exc))
            return False
        if not taken:
            report.deferred += 1
            return None
        return True

    def _prepare(self, row: OutboxRow) -> Any:
        """What to send: a Rendered, (Rendered, cards) for a card update, Dropped or _DEFERRED."""
        if self._waits(row) is _DEFERRED:  # a message on its way: updated once it has landed
            return _DEFERRED
        home = home_of(row)
        thread = self._thread(row, home) if home is not None else None
        if thread is _DEFERRED:
            return _DEFERRED
        rendered = self.render(row)
        if isinstance(thread, Rendered) and rendered is not None:
            rendered = replace(rendered, thread_ts=thread.thread_ts, broadcast=thread.broadcast)
        if row.kind in (OutboxKind.LEASE_CLOSED, OutboxKind.LEASE_REDRAWN):
            if rendered is None or not rendered.updates:
                return Dropped("no message to update")
            return rendered
        if row.kind != OutboxKind.CARD_SETTLED:
            return rendered if rendered is not None else Dropped("nothing left to say")
        with self.db.read() as session:
            cards = outbox.landed(session, row.subject, [OutboxKind.APPROVAL_CARD])
        if rendered is None or not cards:
            return Dropped("no card to update")
        return rendered, [(c.channel, c.ts) for c in cards]

    def _thread(self, row: OutboxRow, home: str) -> Any:
        """Where a reply goes: the thread of its lease's grant DM once that has landed
        (broadcast too when it is the lease's first warning); _DEFERRED while the grant is
        on its way; None (a message of its own) when the grant never landed."""
        with self.db.read() as session:
            about = outbox.owed_about(session, home)
            if home != row.subject:
                about += outbox.owed_about(session, row.subject)
        # Only the holder's messages belong in the thread of the holder's grant: a notice to
        # anyone else about the lease goes out on its own, at once.
        grants = [
            r for r in about if r.kind == OutboxKind.LEASE_GRANTED and r.recipient == row.recipient
        ]
        if any(g.state in _UNSENT for g in grants):
            return _DEFERRED
        landed = [g for g in grants if g.state == outbox.DELIVERED and g.ts]
        if not landed:
            return None
        first = row.kind == OutboxKind.LEASE_WARNING and not any(
            r.kind == OutboxKind.LEASE_WARNING and r.state == outbox.DELIVERED and r.id != row.id
            for r in about
        )
        return Rendered("", [], thread_ts=landed[0].ts, broadcast=first)

    def _record(self, row: OutboxRow, outcome: Outcome, report: Report) -> bool:
        return self._record_all([(row, outcome)], report)[0]

    def _record_all(self, outcomes: list[tuple[OutboxRow, Outcome]], report: Report) -> list[bool]:
        return self.recorder.record_all(self.db, outcomes, report, at=self.clock())
