"""Delivering the outbox to Slack: render, claim, send, record where it landed, retry what failed.

No database transaction is open while Slack is called. A row is claimed (committed, its next
attempt already pushed back) before it is sent, so a failure of any kind, the bookkeeping's
included, waits out a backoff instead of sending again at once. An outcome that could not be
recorded is kept in memory and recorded later, never re-sent. A row claimed by a process that
is gone may have reached Slack: a message is looked up in its conversation by the outbox id it
carries in its metadata before it is sent again; a reply through a response_url, which cannot
be looked up, is sent again (at least once) and counted as in doubt.

Rows go out in the order they were owed; a failure holds back later rows for the same
recipient in this pass, so nobody reads a "denied" before the card it settles.
"""

from __future__ import annotations

import http.client
import logging
import queue
import threading
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.webhook import WebhookClient
from sqlalchemy.exc import SQLAlchemyError

from bot.services.notices import CARDS
from storage import outbox
from storage.db import Database, one_line
from storage.tables import OutboxRow

log = logging.getLogger(__name__)

METADATA_TYPE = "gpubot_outbox"  # every message the outbox posts carries its row id
RESPONSE_URL_LIFE = timedelta(minutes=29)  # Slack honours a response_url for 30 minutes
# How far before the row was owed a message in doubt is looked for: the bot's clock and
# Slack's may disagree by a little.
HISTORY_SLACK = timedelta(minutes=5)
EXPRESS_BATCH = 50  # rows the express thread sends before it records their outcomes at once


@dataclass(frozen=True)
class Rendered:
    text: str
    blocks: list[dict[str, Any]]
    view: dict[str, Any] | None = None  # a Home tab to publish instead of a message


# Renders one owed message from the database as it stands now; None: nothing left to say.
# It opens its own short reads: no transaction stays open across a Slack call.
Render = Callable[[OutboxRow], Rendered | None]


@dataclass
class Report:
    delivered: int = 0
    failed: int = 0
    deferred: int = 0
    dropped: int = 0
    unrecorded: int = 0  # outcomes the database could not take yet (kept, recorded later)
    database_down: bool = False  # a claim failed: the rest of the pass waits for the next
    in_doubt: int = 0  # sent again after a crash with no way to know if it had landed
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Sent:
    channel: str | None
    ts: str | None


@dataclass(frozen=True)
class _NotSent:
    error: str
    retry_after: timedelta | None = None
    # The request may have reached Slack (it timed out, or the link broke while waiting for the
    # answer): before the next attempt, look for it as for a send a crash interrupted.
    in_doubt: bool = False


@dataclass(frozen=True)
class _Dropped:
    why: str


_Outcome = _Sent | _NotSent | _Dropped
_DEFERRED = object()  # not yet: a card update waiting for its card


class ResponseUrlError(Exception):
    """A response_url answered something else than 200 ok."""

    def __init__(self, status: int, body: str, retry_after: timedelta | None) -> None:
        super().__init__(f"response_url answered {status}: {body[:100]}")
        self.status, self.body, self.retry_after = status, body, retry_after

    @property
    def gone(self) -> bool:
        """Expired or used up: no retry will ever work."""
        return self.status in (404, 410) or self.body in ("expired_url", "used_url", "bad_url")


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
        # The outbox retries, not the client: a client retry after a timeout may post a message
        # Slack already took, and Retry-After is honoured through the row's next attempt rather
        # than by sleeping in the pass.
        self.client = WebClient(
            token=client.token, base_url=client.base_url, timeout=client.timeout, retry_handlers=[]
        )
        self.render = render
        self.clock = clock
        self.max_attempts = max_attempts
        self.token = uuid.uuid4().hex[:12]  # this process's claims
        self._dm: dict[str, str] = {}
        self._known: dict[int, _Outcome] = {}  # outcomes not recorded yet
        self._inflight: set[int] = set()  # handed to the express thread, not done with yet
        self._known_lock = threading.Lock()
        self._pass = threading.Lock()  # one pass at a time, whoever asks
        self._wanted = threading.Event()
        self._express: queue.SimpleQueue[list[int] | None] = queue.SimpleQueue()
        self._express_thread: threading.Thread | None = None
        self._express_lock = threading.Lock()

    def express(self, row_ids: list[int]) -> None:
        """Send these rows at once on the express thread: what a request just owed (its answer,
        the DMs and cards of its decision), claimed for this deliverer in the request's own
        commit. The inbox's workers never wait on Slack; the pass leaves these rows alone."""
        if not row_ids:
            return
        with self._known_lock:
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
            with self._known_lock:
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
        _summarise(report)
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
            with self._known_lock:
                self._inflight.difference_update(ids)
        _summarise(report)
        return report

    def _deliver_rows(self, ids: list[int], report: Report) -> None:
        try:
            with self.db.read() as session:
                rows = [r for r in (session.get(OutboxRow, i) for i in ids) if r is not None]
        except SQLAlchemyError as exc:
            report.errors.append(f"reading the outbox: {one_line(exc)}")
            return
        now = self.clock()
        sent: list[tuple[OutboxRow, _Outcome]] = []
        for row in rows:
            if row.kind == "card_settled" and sent:
                # The card it updates may be among those just sent: on record first.
                self._record_all(sent, report)
                sent = []
            # A reply on a response_url cannot be looked up after a crash: its outcome is
            # recorded at once, so a crash can repeat at most the one in flight. Messages,
            # which can be looked up, are recorded together after the batch.
            later = None if row.kind == "reply" and row.data.get("response_url") else sent
            mine = row.state == outbox.SENDING and row.claimed_by == self.token
            if mine:
                self._attempt(row, report, claimed=True, later=later)
            elif row.state == outbox.PENDING and row.next_attempt_at <= now:
                self._attempt(row, report, later=later)
        self._record_all(sent, report)

    def _send_all(self, rows: list[OutboxRow], report: Report) -> None:
        blocked: set[str] = set()
        with self._known_lock:
            rows = [r for r in rows if r.id not in self._inflight]  # the express thread's
        newest_home = {r.recipient: r.id for r in rows if r.kind == "home"}
        for row in rows:
            assert row.id is not None
            if report.database_down:  # every claim would wait out the database, one by one
                report.deferred += 1
                continue
            if row.recipient in blocked:
                report.deferred += 1
                continue
            if row.kind == "home" and newest_home.get(row.recipient) != row.id:
                self._record(row, _Dropped("a newer Home tab replaces it"), report)
                continue
            if not self._attempt(row, report):
                blocked.add(row.recipient)

    def _attempt(
        self,
        row: OutboxRow,
        report: Report,
        *,
        claimed: bool = False,
        later: list[tuple[OutboxRow, _Outcome]] | None = None,
    ) -> bool:
        """One row: False when it did not get through (later rows for its recipient wait).
        `claimed`: this deliverer holds the row's claim already (made in the owing commit);
        `later`: the outcome of a send goes there, to be recorded with others."""
        assert row.id is not None
        with self._known_lock:
            known = self._known.get(row.id)
        if known is not None:  # sent (or not) earlier in this process; only the record is late
            return self._record(row, known, report)
        try:
            prepared = self._prepare(row)
        except Exception as exc:  # a rendering bug: the row waits its backoff, the rest goes on
            log.exception("rendering outbox row %s (%s) failed", row.id, row.kind)
            prepared = _NotSent(f"rendering failed: {type(exc).__name__}: {exc}")
        if prepared is _DEFERRED:
            report.deferred += 1
            return True
        if isinstance(prepared, _Dropped):
            return self._record(row, prepared, report)
        in_doubt = not claimed and row.state == outbox.SENDING and row.claimed_by != self.token
        in_doubt = in_doubt or row.claimed_by == outbox.IN_DOUBT
        if in_doubt and not isinstance(prepared, _NotSent):
            landed = self._landed(row, prepared)
            if landed is not None:
                return self._record(row, landed, report)
        if not claimed:
            taken = self._claim(row, report)
            if taken is not True:
                return taken is None  # None: another pass or worker took it
        if in_doubt:
            report.in_doubt += 1
            log.info(
                "outbox row %s (%s): claimed before a restart or a timeout and not found in "
                "Slack; sending it (now, or again)",
                row.id,
                row.kind,
            )
        if isinstance(prepared, _NotSent):
            outcome: _Outcome = prepared
        else:
            outcome = self._send(row, prepared)
        if later is not None:
            later.append((row, outcome))
            return not isinstance(outcome, _NotSent)
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
        """What to send: a Rendered, (Rendered, cards) for a card update, _Dropped or _DEFERRED."""
        rendered = self.render(row)
        if row.kind != "card_settled":
            return rendered if rendered is not None else _Dropped("nothing left to say")
        with self.db.read() as session:
            cards = outbox.landed(session, row.subject, ["approval_card"])
            waiting = [
                r
                for r in outbox.owed_about(session, row.subject)
                if r.kind == "approval_card" and r.state in (outbox.PENDING, outbox.SENDING)
            ]
        if waiting:  # a card still on its way: update it once it has landed
            return _DEFERRED
        if rendered is None or not cards:
            return _Dropped("no card to update")
        return rendered, [(c.channel, c.ts) for c in cards]

    def _send(self, row: OutboxRow, prepared: Any) -> _Outcome:
        try:
            return self._call_slack(row, prepared)
        except ResponseUrlError as exc:
            return _NotSent(str(exc), exc.retry_after)
        except SlackApiError as exc:
            return _NotSent(_describe(exc), _retry_after(exc.response.headers))
        except (SlackRequestError, OSError, http.client.HTTPException) as exc:
            return _NotSent(_describe(exc), in_doubt=_maybe_arrived(exc))

    def _call_slack(self, row: OutboxRow, prepared: Any) -> _Outcome:
        if row.kind == "card_settled":
            rendered, cards = prepared
            for channel, ts in cards:
                self.client.chat_update(
                    channel=channel, ts=ts, text=rendered.text, blocks=rendered.blocks
                )
            return _Sent(cards[0][0], cards[0][1])
        if row.kind == "home":
            self.client.views_publish(user_id=row.recipient, view=prepared.view)
            return _Sent(None, None)
        url = row.data.get("response_url") if row.kind == "reply" else None
        if isinstance(url, str) and url and self.clock() - row.created_at < RESPONSE_URL_LIFE:
            try:
                self._respond(url, prepared)
                return _Sent(None, None)
            except ResponseUrlError as exc:
                if not exc.gone:
                    raise
                log.info("outbox row %s: the response_url is gone; answering by DM", row.id)
        channel = self._channel_for(row.recipient)
        answer = self.client.chat_postMessage(
            channel=channel,
            text=prepared.text,
            blocks=prepared.blocks,
            metadata={"event_type": METADATA_TYPE, "event_payload": {"outbox_id": row.id}},
        )
        return _Sent(str(answer["channel"]), str(answer["ts"]))

    def _respond(self, url: str, rendered: Rendered) -> None:
        hook = WebhookClient(url, timeout=int(self.client.timeout))
        try:
            answer = hook.send_dict(
                {
                    "text": rendered.text,
                    "blocks": rendered.blocks,
                    "response_type": "ephemeral",
                    "replace_original": False,
                }
            )
        except ValueError:  # not a URL urllib can open: no retry will mend it
            raise ResponseUrlError(0, "bad_url", None) from None
        if answer.status_code != 200:
            headers = {k.lower(): v for k, v in (answer.headers or {}).items()}
            raise ResponseUrlError(answer.status_code, answer.body, _retry_after(headers))

    def _landed(self, row: OutboxRow, prepared: Any) -> _Sent | None:
        """Where a message in doubt landed, if Slack has it (looked up by its outbox id)."""
        posts_message = row.kind not in ("card_settled", "home")
        url = row.data.get("response_url") if row.kind == "reply" else None
        fresh = self.clock() - row.created_at < RESPONSE_URL_LIFE
        if not posts_message or (url and fresh):
            return None
        try:
            channel = self._channel_for(row.recipient)
            oldest = (row.created_at - HISTORY_SLACK).timestamp()
            history = self.client.conversations_history(
                channel=channel, oldest=f"{oldest:.6f}", limit=200, include_all_metadata=True
            )
        except (SlackApiError, SlackRequestError, OSError) as exc:
            log.warning("cannot check whether outbox row %s landed (%s)", row.id, exc)
            return None
        for message in history.get("messages") or []:
            meta = message.get("metadata") or {}
            payload = meta.get("event_payload") or {}
            if meta.get("event_type") == METADATA_TYPE and payload.get("outbox_id") == row.id:
                return _Sent(channel, str(message.get("ts")))
        return None

    def _record(self, row: OutboxRow, outcome: _Outcome, report: Report) -> bool:
        return self._record_all([(row, outcome)], report)[0]

    def _record_all(self, outcomes: list[tuple[OutboxRow, _Outcome]], report: Report) -> list[bool]:
        """Record what became of these rows, in one transaction; per row, whether it got
        through. Outcomes the database does not take are kept, to be recorded later."""
        if not outcomes:
            return []
        at = self.clock()
        retries: list[datetime | None] = []
        try:
            with self.db.write() as session:
                for row, outcome in outcomes:
                    assert row.id is not None
                    retries.append(self._apply(session, row.id, outcome, at))
        except SQLAlchemyError as exc:
            with self._known_lock:
                self._known.update((row.id, outcome) for row, outcome in outcomes if row.id)
            report.unrecorded += len(outcomes)
            log.warning(
                "%d delivery outcome(s) kept until the database takes them (%s)",
                len(outcomes),
                one_line(exc),
            )
            return [isinstance(outcome, _Sent) for _, outcome in outcomes]
        with self._known_lock:
            for row, _ in outcomes:
                self._known.pop(row.id or 0, None)
        return [
            self._count(row, outcome, retry, report)
            for (row, outcome), retry in zip(outcomes, retries, strict=True)
        ]

    def _apply(self, session: Any, row_id: int, outcome: _Outcome, at: datetime) -> datetime | None:
        if isinstance(outcome, _Sent):
            outbox.delivered(session, row_id, at=at, channel=outcome.channel, ts=outcome.ts)
            return None
        if isinstance(outcome, _Dropped):
            outbox.dropped(session, row_id, at=at, why=outcome.why)
            return None
        return outbox.failed(
            session,
            row_id,
            at=at,
            error=outcome.error,
            retry_after=outcome.retry_after,
            max_attempts=self.max_attempts,
            in_doubt=outcome.in_doubt,
        )

    def _count(
        self, row: OutboxRow, outcome: _Outcome, retry: datetime | None, report: Report
    ) -> bool:
        if isinstance(outcome, _Sent):
            report.delivered += 1
            return True
        if isinstance(outcome, _Dropped):
            report.dropped += 1
            return True
        report.failed += 1
        report.errors.append(f"{row.kind} {row.subject}: {outcome.error}")
        if retry is None:
            log.error(
                "outbox row %s (%s to %s) given up after %d attempts: %s",
                row.id,
                row.kind,
                row.recipient,
                self.max_attempts,
                outcome.error,
            )
        else:
            log.debug(
                "delivery of %s %s failed (%s); retrying at %s",
                row.kind,
                row.subject,
                outcome.error,
                retry.isoformat(),
            )
        return False

    def _channel_for(self, recipient: str) -> str:
        """Channels as they are; a person through their DM with the bot (opened once)."""
        if recipient == CARDS or recipient[:1] not in ("U", "W"):
            return recipient
        if recipient not in self._dm:
            opened = self.client.conversations_open(users=recipient)
            self._dm[recipient] = str(opened["channel"]["id"])
        return self._dm[recipient]


def _summarise(report: Report) -> None:
    """One line for the deliveries that failed in a pass (each waits its backoff), not one each:
    an outage would otherwise write a line per owed message per try."""
    if report.failed:
        tried = report.delivered + report.failed
        log.warning(
            "%d of %d deliveries failed, each retried with backoff (first: %s)",
            report.failed,
            tried,
            report.errors[0] if report.errors else "?",
        )


def _maybe_arrived(exc: BaseException) -> bool:
    """Did the request perhaps reach Slack? A timeout or a link that broke while waiting for
    the answer says nothing of what Slack did; a refused connection says it never arrived."""
    reason = getattr(exc, "reason", None)
    if isinstance(exc, ConnectionRefusedError) or isinstance(reason, ConnectionRefusedError):
        return False
    if isinstance(exc, urllib.error.URLError) and not isinstance(reason, TimeoutError | OSError):
        return False  # a name that did not resolve, a bad URL: nothing was sent
    return isinstance(exc, OSError | http.client.HTTPException)


def _retry_after(headers: Any) -> timedelta | None:
    values = headers.get("retry-after") or headers.get("Retry-After") if headers else None
    value = values[0] if isinstance(values, list) else values
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return timedelta(seconds=min(max(seconds, 0.0), 3600.0)) if seconds is not None else None


def _describe(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return f"slack answered {exc.response.status_code}: {exc.response.get('error', '?')}"
    return f"{type(exc).__name__}: {exc}"
