"""How one outbox row reaches Slack, and what became of it: a message posted (carrying its
outbox id in Slack's message metadata), a card updated, a Home tab published, a reply POSTed
to its response_url (a DM once that has expired), or a file shared (its id kept in the row
before the share); and, for a send left in doubt, whether the message landed after all, looked
up in its conversation (or, for a reply in a lease's thread, in that thread) by that outbox id,
or a file by its id.

No retry happens here: the outbox retries, so a timeout is never followed by a second post of
a message Slack may already have taken.
"""

from __future__ import annotations

import http.client
import logging
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.webhook import WebhookClient

from bot.services.notices import CARDS
from storage.outbox import OutboxKind
from storage.tables import OutboxRow

log = logging.getLogger(__name__)

METADATA_TYPE = "gpubot_outbox"  # every message the outbox posts carries its row id
RESPONSE_URL_LIFE = timedelta(minutes=29)  # Slack honours a response_url for 30 minutes
# How far before the row was owed a message in doubt is looked for: the bot's clock and
# Slack's may disagree by a little.
HISTORY_SLACK = timedelta(minutes=5)


@dataclass(frozen=True)
class Upload:
    """A file to share (files.getUploadURLExternal, its bytes, files.completeUploadExternal)."""

    filename: str
    title: str
    content: bytes
    comment: str = ""


@dataclass(frozen=True)
class Rendered:
    text: str
    blocks: list[dict[str, Any]]
    view: dict[str, Any] | None = None  # a Home tab to publish instead of a message
    # Messages already posted to redraw in place instead: (channel, ts, what it says now).
    updates: tuple[tuple[str, str, Rendered], ...] = ()
    # A reply in the thread of this message (its ts), shown in the conversation too when
    # `broadcast`.
    thread_ts: str | None = None
    broadcast: bool = False
    # Recorded in the row's data once it is delivered (what a redraw drew).
    note: Mapping[str, Any] | None = None
    # A file shared in the conversation instead of a message (`text` is its comment).
    upload: Upload | None = None
    # Where the message goes instead of its recipient's DM or channel (a conversation id).
    where: str | None = None


#: Kinds that redraw messages already posted (a card, a lease's DMs) instead of posting one,
#: each with the kinds of the messages it redraws: it waits for those still on their way.
UPDATES: dict[str, tuple[str, ...]] = {
    OutboxKind.CARD_SETTLED: (OutboxKind.APPROVAL_CARD,),
    # The end is drawn last: a redraw of the lease still active, if one is on its way, first.
    OutboxKind.LEASE_CLOSED: (
        OutboxKind.LEASE_GRANTED,
        OutboxKind.LEASE_WARNING,
        OutboxKind.LEASE_REDRAWN,
    ),
    # The grant DM shows the lease as it stands once what its thread was told has landed.
    OutboxKind.LEASE_REDRAWN: (
        OutboxKind.LEASE_GRANTED,
        OutboxKind.LEASE_WARNING,
        OutboxKind.LEASE_RECLAIMED,
        OutboxKind.LEASE_ENDED,
        OutboxKind.RECALL_WITHDRAWN,
    ),
}

#: Kinds that arrive as replies in the thread of their lease's grant DM, the lease's home.
THREADED = frozenset(
    {
        OutboxKind.LEASE_WARNING,
        OutboxKind.LEASE_RECLAIMED,
        OutboxKind.LEASE_ENDED,
        OutboxKind.RECALL_WITHDRAWN,
    }
)


def home_of(row: OutboxRow) -> str | None:
    """The subject whose grant DM is `row`'s thread ("lease:7"), or None: a message of its own.
    A settled extension, and a notice about a lease (a shrink, someone else on its GPUs), go
    to its lease's thread."""
    if row.kind in THREADED or (row.kind == OutboxKind.NOTICE and row.subject.startswith("lease:")):
        return row.subject
    lease = row.data.get("lease") if row.kind == OutboxKind.REQUEST_DECIDED else None
    return f"lease:{lease}" if lease else None


# Renders one owed message from the database as it stands now; None: nothing left to say.
# It opens its own short reads: no transaction stays open across a Slack call.
Render = Callable[[OutboxRow], Rendered | None]


@dataclass(frozen=True)
class Sent:
    channel: str | None
    ts: str | None
    note: Mapping[str, Any] | None = None  # recorded in the row's data


@dataclass(frozen=True)
class NotSent:
    error: str
    retry_after: timedelta | None = None
    # The request may have reached Slack (it timed out, or the link broke while waiting for the
    # answer): before the next attempt, look for it as for a send a crash interrupted.
    in_doubt: bool = False


@dataclass(frozen=True)
class Dropped:
    why: str


Outcome = Sent | NotSent | Dropped


class ResponseUrlError(Exception):
    """A response_url answered something else than 200 ok."""

    def __init__(self, status: int, body: str, retry_after: timedelta | None) -> None:
        super().__init__(f"response_url answered {status}: {body[:100]}")
        self.status, self.body, self.retry_after = status, body, retry_after

    @property
    def gone(self) -> bool:
        """Expired or used up: no retry will ever work."""
        return self.status in (404, 410) or self.body in ("expired_url", "used_url", "bad_url")


class FileIdNotKeptError(Exception):
    """The id of a file on its way could not be kept: it is not shared, so no share is left
    in doubt that could not be looked for."""


# Keeps a key and value in an outbox row's data while it is on its way (its id, them).
Note = Callable[[int, Mapping[str, Any]], None]


def _no_note(row_id: int, data: Mapping[str, Any]) -> None:
    pass


class Sender:
    """Talks to Slack for the outbox, with a client that never retries on its own."""

    def __init__(self, client: WebClient, note: Note = _no_note) -> None:
        self.note = note
        # Retry-After is honoured through the row's next attempt rather than by sleeping here.
        self.client = WebClient(
            token=client.token, base_url=client.base_url, timeout=client.timeout, retry_handlers=[]
        )
        self._dm: dict[str, str] = {}

    def send(self, row: OutboxRow, prepared: Any, now: datetime) -> Outcome:
        """One attempt: a Rendered, or (Rendered, cards) for a card update. A reply whose
        thread is gone (its parent deleted), or a digest whose message is, is posted on its
        own instead."""
        try:
            try:
                return self._call(row, prepared, now)
            except SlackApiError as exc:
                fallback = _fallback(row, prepared, exc)
                if fallback is None:
                    raise
                return self._call(row, fallback, now)
        except ResponseUrlError as exc:
            return NotSent(str(exc), exc.retry_after)
        except FileIdNotKeptError as exc:
            return NotSent(str(exc))
        except SlackApiError as exc:
            if _shared_nowhere(row, exc):
                log.info("outbox row %s (%s) dropped: %s", row.id, row.kind, _describe(exc))
                return Dropped(f"not shared: {_describe(exc)}")
            return NotSent(_describe(exc), _retry_after(exc.response.headers))
        except (SlackRequestError, OSError, http.client.HTTPException) as exc:
            return NotSent(_describe(exc), in_doubt=_maybe_arrived(exc))

    def landed(self, row: OutboxRow, now: datetime, prepared: Any = None) -> Sent | None:
        """Where a message in doubt landed, if Slack has it (looked up by its outbox id, in its
        thread for a reply). None for what cannot be looked up: a reply on a live
        response_url; or need not be: a redraw or a Home tab, which are the same however often
        they are sent. A report's file, or its text bars, is also looked for in the asker's DM,
        where it goes when its channel cannot take it."""
        if row.kind in UPDATES or row.kind == OutboxKind.HOME or _live_url(row, now):
            return None
        if isinstance(prepared, Rendered) and prepared.updates:
            return None
        thread = prepared.thread_ts if isinstance(prepared, Rendered) else None
        places = [_where(row, prepared)]
        if row.kind == OutboxKind.REPORT_FILE and places[0] != row.recipient:
            places.append(row.recipient)  # where it goes when its channel cannot take it
        for place in places:
            found = self._found_in(row, place, thread)
            if found is not None:
                return found
        return None

    def _found_in(self, row: OutboxRow, place: str, thread: str | None) -> Sent | None:
        """The message or file of `row` in the conversation `place`, if it is there."""
        try:
            channel = self._channel_for(place)
            oldest = f"{(row.created_at - HISTORY_SLACK).timestamp():.6f}"
            if thread:
                history = self.client.conversations_replies(
                    channel=channel, ts=thread, oldest=oldest, include_all_metadata=True
                )
            else:
                history = self.client.conversations_history(
                    channel=channel, oldest=oldest, limit=200, include_all_metadata=True
                )
        except (SlackApiError, SlackRequestError, OSError) as exc:
            log.warning("cannot check whether outbox row %s landed (%s)", row.id, exc)
            return None
        for message in history.get("messages") or []:
            meta = message.get("metadata") or {}
            payload = meta.get("event_payload") or {}
            if meta.get("event_type") == METADATA_TYPE and payload.get("outbox_id") == row.id:
                return Sent(channel, str(message.get("ts")))
            if _shares(message, row):
                return Sent(channel, str(message.get("ts")))
        return None

    def _call(self, row: OutboxRow, prepared: Any, now: datetime) -> Outcome:
        if isinstance(prepared, Rendered) and prepared.upload is not None:
            return self._upload(row, prepared.upload)
        return self._post(row, prepared, now)

    def _post(self, row: OutboxRow, prepared: Any, now: datetime) -> Outcome:
        if row.kind == OutboxKind.CARD_SETTLED:
            rendered, cards = prepared
            for channel, ts in cards:
                self.client.chat_update(
                    channel=channel, ts=ts, text=rendered.text, blocks=rendered.blocks
                )
            return Sent(cards[0][0], cards[0][1])
        if row.kind in UPDATES or (isinstance(prepared, Rendered) and prepared.updates):
            for channel, ts, shown in prepared.updates:
                self.client.chat_update(
                    channel=channel, ts=ts, text=shown.text, blocks=shown.blocks
                )
            return Sent(prepared.updates[0][0], prepared.updates[0][1], prepared.note)
        if row.kind == OutboxKind.HOME:
            self.client.views_publish(user_id=row.recipient, view=prepared.view)
            return Sent(None, None)
        url = _live_url(row, now)
        if url is not None:
            try:
                self._respond(url, prepared)
                return Sent(None, None)
            except ResponseUrlError as exc:
                if not exc.gone:
                    raise
                log.info("outbox row %s: the response_url is gone; answering by DM", row.id)
        channel = self._channel_for(prepared.where or row.recipient)
        threaded: dict[str, Any] = {}
        if prepared.thread_ts:
            threaded = {"thread_ts": prepared.thread_ts, "reply_broadcast": prepared.broadcast}
        answer = self.client.chat_postMessage(
            channel=channel,
            text=prepared.text,
            blocks=prepared.blocks,
            metadata={"event_type": METADATA_TYPE, "event_payload": {"outbox_id": row.id}},
            **threaded,
        )
        return Sent(str(answer["channel"]), str(answer["ts"]))

    def _upload(self, row: OutboxRow, upload: Upload) -> Sent:
        """files_upload_v2's three steps, with the file's id kept in the row before the share:
        a share in doubt is then looked for by that id (a message carries no metadata)."""
        assert row.id is not None
        channel = self._channel_for(shared_in(row))
        url = self.client.files_getUploadURLExternal(
            filename=upload.filename, length=len(upload.content)
        )
        file_id = str(url["file_id"])
        try:
            self.note(row.id, {"file_id": file_id})
        except Exception as exc:
            raise FileIdNotKeptError(
                f"the file's id could not be kept: {type(exc).__name__}"
            ) from exc
        sent = self.client._upload_file(  # the bytes, as files_upload_v2 sends them
            url=str(url["upload_url"]),
            data=upload.content,
            logger=log,
            timeout=self.client.timeout,
            proxy=self.client.proxy,
            ssl=self.client.ssl,
        )
        if sent.status != 200:
            raise SlackRequestError(f"the upload answered {sent.status}: {sent.body[:100]}")
        try:
            self._share(file_id, upload, channel)
        except SlackApiError as exc:
            dm = self._channel_for(row.recipient)
            if exc.response.get("error") not in _NOWHERE or dm == channel:
                raise
            log.info(
                "outbox row %s: %s; sharing the file in the DM instead", row.id, _describe(exc)
            )
            self._share(file_id, upload, dm)
            channel = dm
        return Sent(channel, None, {"file_id": file_id})

    def _share(self, file_id: str, upload: Upload, channel: str) -> None:
        self.client.files_completeUploadExternal(
            files=[{"id": file_id, "title": upload.title}],
            channel_id=channel,
            initial_comment=upload.comment or None,
        )

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

    def _channel_for(self, recipient: str) -> str:
        """Channels as they are; a person through their DM with the bot (opened once)."""
        if recipient == CARDS or recipient[:1] not in ("U", "W"):
            return recipient
        if recipient not in self._dm:
            opened = self.client.conversations_open(users=recipient)
            self._dm[recipient] = str(opened["channel"]["id"])
        return self._dm[recipient]


def shared_in(row: OutboxRow) -> str:
    """Where a file is shared: the conversation its row names, else its recipient's DM."""
    return str(row.data.get("channel") or row.recipient)


def _where(row: OutboxRow, prepared: Any) -> str:
    """The conversation a row's message or file lands in (a person: their DM)."""
    if isinstance(prepared, Rendered) and prepared.upload is not None:
        return shared_in(row)
    if isinstance(prepared, Rendered) and prepared.where:
        return prepared.where
    return row.recipient


def has_live_url(row: OutboxRow, now: datetime) -> bool:
    """A reply that goes to a response_url Slack still honours (which cannot be looked up)."""
    return _live_url(row, now) is not None


def _live_url(row: OutboxRow, now: datetime) -> str | None:
    url = row.data.get("response_url") if row.kind == OutboxKind.REPLY else None
    if isinstance(url, str) and url and now - row.created_at < RESPONSE_URL_LIFE:
        return url
    return None


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


#: What Slack answers an update of a message it will not update any more (deleted, or too old).
_MESSAGE_GONE = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})


def _fallback(row: OutboxRow, prepared: Any, exc: SlackApiError) -> Rendered | None:
    """What to post instead when Slack refused `prepared` for good, or None: a reply whose
    thread is gone is posted on its own; a message that grows another in place (a digest
    updating the previous one) is posted anew, with all it says, when that one is gone, and
    the next grows the new one; a report's text bars for a conversation the bot cannot post
    in go to the asker's DM, as its file would."""
    if not isinstance(prepared, Rendered):
        return None
    error = exc.response.get("error")
    if error == "thread_not_found":
        return replace(prepared, thread_ts=None, broadcast=False)
    if error in _MESSAGE_GONE and prepared.updates and row.kind not in UPDATES:
        return replace(prepared, updates=())
    if error in _NOWHERE and row.kind == OutboxKind.REPORT_FILE and _elsewhere(row, prepared):
        return replace(prepared, where=None)  # text bars for a channel it cannot post in: the DM
    return None


def _elsewhere(row: OutboxRow, prepared: Rendered) -> bool:
    """Is `prepared` a message for a conversation other than its recipient's DM?"""
    return prepared.upload is None and prepared.where not in (None, row.recipient)


#: What Slack answers a share in a conversation the bot cannot post a file to, for good.
_NOWHERE = frozenset({"channel_not_found", "not_in_channel", "is_archived", "invalid_channel"})


def _shared_nowhere(row: OutboxRow, exc: SlackApiError) -> bool:
    """A file for a conversation that is gone or that the bot is not in: no retry will share
    it (a message falls back to its channel's public posting instead)."""
    return row.kind == OutboxKind.REPORT_FILE and exc.response.get("error") in _NOWHERE


def _shares(message: Mapping[str, Any], row: OutboxRow) -> bool:
    """Does `message` share the file `row` was uploading (its id kept before the share)?"""
    file_id = row.data.get("file_id") if row.kind == OutboxKind.REPORT_FILE else None
    files = message.get("files") or []
    return bool(file_id) and any(f.get("id") == file_id for f in files if isinstance(f, dict))


def _describe(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return f"slack answered {exc.response.status_code}: {exc.response.get('error', '?')}"
    return f"{type(exc).__name__}: {exc}"
