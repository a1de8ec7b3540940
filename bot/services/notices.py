"""The messages a decision owes people, written to the outbox in the decision's transaction.

Kinds (the Slack adapter renders each from the database when it delivers):
    approval_card    a request waits for a person: to the approval channel, or each approver's DM
    approval_reminder it still waits (bot.services.approval_lifecycle): a reply in a card's thread,
                     a DM to an approver, or the holder's DM about a pending extension
    card_settled     update every approval card of a request in place (recipient "cards")
    request_decided  tell the requester what a person decided
    lease_granted    the holder's DM: hosts, GPU indices, CUDA_VISIBLE_DEVICES, expiry, buttons
    lease_ended      tell the holder someone else ended their lease
    lease_closed     update the lease's grant and warning DMs in place once it ended: no
                     buttons, how and when it ended (recipient the holder)
    lease_redrawn    update the grant DM in place with the lease as it stands (warned,
                     extended, recalled, ended): the parent of the lease's thread
    lease_warning    expiry, idle or unhealthy, before anything is taken (buttons to answer)
    lease_reclaimed  the lease was reclaimed, and why
    recall_withdrawn the lease warned of preemption stays: its recall is no longer needed
    unreserved_use   a process runs on a GPU no lease covers: offer a borrow
    admin_digest     the lines owed to one admin within a few seconds (a sweep's faults,
                     would-haves, unreserved use, devices), in one message
    admin_notice     one line for each admin (rows owed before the digest existed)
    notice           a line for one person (someone else runs on their leased GPU, ...)

The grant DM is the lease's home: warnings, the reclaim, the end, a withdrawn recall and a
settled extension are replies in its thread (`bot.slack.sending.THREADED`), and each of them
owes a `lease_redrawn` of the grant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from sqlmodel import Session

from storage import outbox, requests
from storage.outbox import OutboxKind, Owed, owe
from storage.tables import LeaseRow, RequestRow

CARDS = "cards"  # the recipient of card_settled: wherever the request's cards landed


def approval_cards(session: Session, request: RequestRow, *, at: datetime) -> None:
    """A channel route gets one card; a DM route gets one per approver."""
    subject = f"request:{request.id}"
    route = request.approval_route
    recipients = [route] if route.startswith(("C", "G")) else list(request.approvers)
    for recipient in recipients:
        owe(
            session,
            Owed(OutboxKind.APPROVAL_CARD, subject, recipient, {"request": request.id}),
            at=at,
        )


def settled(
    session: Session,
    request: RequestRow,
    *,
    by: str,
    verdict: str,
    reason: str,
    at: datetime,
    tell_requester: bool = True,
) -> None:
    subject = f"request:{request.id}"
    data: dict[str, object] = {
        "request": request.id,
        "by": by,
        "verdict": verdict,
        "reason": reason,
    }
    owe(session, Owed(OutboxKind.CARD_SETTLED, subject, CARDS, data), at=at)
    if tell_requester:
        if request.lease_id is not None:  # an extension: told in its lease's thread
            data = {**data, "lease": request.lease_id}
            lease_changed(session, request.lease_id, request.requester, at=at)
        owe(session, Owed(OutboxKind.REQUEST_DECIDED, subject, request.requester, data), at=at)


def granted(
    session: Session, lease: LeaseRow, *, at: datetime, unknown: Sequence[str] = ()
) -> None:
    """The grant DM; `unknown`: its GPUs ("node:index") that had no fresh telemetry."""
    data: dict[str, object] = {"lease": lease.id}
    if unknown:
        data["unknown"] = list(unknown)
    owe(session, Owed(OutboxKind.LEASE_GRANTED, f"lease:{lease.id}", lease.holder, data), at=at)


def ended_by_other(session: Session, lease: LeaseRow, *, by: str, at: datetime) -> None:
    data = {"lease": lease.id, "by": by}
    owe(session, Owed(OutboxKind.LEASE_ENDED, f"lease:{lease.id}", lease.holder, data), at=at)


# A grant DM is redrawn at most this often: what happens to its lease meanwhile (a warning, a
# reply, an extension) folds into the one pending redraw.
PARENT_EVERY = timedelta(seconds=2)


def lease_changed(session: Session, lease_id: int | None, holder: str, *, at: datetime) -> None:
    """The lease moved (warned, extended, recalled, shrunk, told something in its thread): its
    grant DM, the thread's parent, is redrawn in place as the lease stands then."""
    if lease_id is None:
        return
    subject = f"lease:{lease_id}"
    # Only a redraw nobody has taken yet still shows this change (a redraw is drawn once it
    # is claimed): one taken may have been drawn before it.
    if not outbox.untaken(session, subject, OutboxKind.LEASE_REDRAWN):
        message = Owed(OutboxKind.LEASE_REDRAWN, subject, holder, {"lease": lease_id})
        owe(session, message, at=at, after=PARENT_EVERY)


def warned(session: Session, lease: LeaseRow, data: dict[str, object], *, at: datetime) -> int:
    """A warning in the lease's thread (and its grant DM redrawn); the outbox row's id."""
    owed = owe(
        session, Owed(OutboxKind.LEASE_WARNING, f"lease:{lease.id}", lease.holder, data), at=at
    )
    lease_changed(session, lease.id, lease.holder, at=at)
    assert owed.id is not None
    return owed.id


def lease_closed(session: Session, lease: LeaseRow, *, by: str, at: datetime) -> None:
    owe(session, closed(lease, by=by), at=at)


def closed(lease: LeaseRow, *, by: str) -> Owed:
    data = {"lease": lease.id, "by": by}
    return Owed(OutboxKind.LEASE_CLOSED, f"lease:{lease.id}", lease.holder, data)


def card_redrawn(request: RequestRow, *, by: str, reason: str = "") -> Owed:
    """Every approval card of a request drawn again as the request stands now."""
    data = {"request": request.id, "by": by, "verdict": "", "reason": reason}
    return Owed(OutboxKind.CARD_SETTLED, f"request:{request.id}", CARDS, data)


def redraw(
    session: Session,
    message: Owed,
    *,
    at: datetime,
    again: bool = False,
    after: timedelta | None = None,
) -> None:
    """Redraw messages in place (a lease_closed or card_settled) unless such a redraw is
    already on its way, or (unless `again`) done: a button pressed on a message its subject
    has moved past, or numbers on a waiting card that moved."""
    states = [outbox.PENDING, outbox.SENDING] + ([] if again else [outbox.DELIVERED])
    if not outbox.any_about(session, message.subject, message.kind, states):
        owe(session, message, at=at, after=after)


# Numbers on a waiting card are redrawn at most this often: every change in the meantime folds
# into the one pending redraw, and none of them holds up the answer of the request that moved
# them (nor eats into Slack's rate limit for messages that matter more).
CARD_NUMBERS_EVERY = timedelta(seconds=30)


def waiting_cards(session: Session, pool: str, *, at: datetime, besides: int | None) -> None:
    """GPUs in `pool` were taken or given back: the quota and queue numbers on its waiting
    approval cards moved, so they are drawn again (buttons and all)."""
    # redraw(..., again=True) for each, in one read: only a card with no redraw on its way
    # yet owes one, so a busy pool costs one query per grant, not one per waiting card
    on_its_way = [outbox.PENDING, outbox.SENDING]
    kind = OutboxKind.CARD_SETTLED
    for request_id in requests.cards_to_redraw(session, pool, kind, on_its_way, besides):
        data = {"request": request_id, "by": "", "verdict": "", "reason": ""}
        message = Owed(kind, f"request:{request_id}", CARDS, data)
        owe(session, message, at=at, after=CARD_NUMBERS_EVERY)


def recall_withdrawn(session: Session, lease: LeaseRow, *, at: datetime) -> None:
    data = {"lease": lease.id}
    owe(session, Owed(OutboxKind.RECALL_WITHDRAWN, f"lease:{lease.id}", lease.holder, data), at=at)
    lease_changed(session, lease.id, lease.holder, at=at)


def tell(session: Session, user: str, subject: str, text: str, *, at: datetime) -> None:
    """A one-off notice to one person (rendered like an admin notice)."""
    owe(session, Owed(OutboxKind.NOTICE, subject, user, {"text": text}), at=at)


# Lines for an admin owed within this long share one digest message (a sweep owes all of its
# lines within a pass). A digest is only grown while it is not due for a while yet; and as it
# is drawn once claimed, and locked while it grows, a line added just before its claim is in it.
DIGEST_WAIT = timedelta(seconds=10)
_DIGEST_MARGIN = timedelta(seconds=3)
DIGEST_MAX_LINES = 40


def tell_admins(
    session: Session,
    admins: Iterable[str],
    subject: str,
    text: str,
    *,
    at: datetime,
    now: datetime | None = None,
) -> None:
    """A line for each admin, in their digest: the one still waiting to go out, or a new one.
    `at`: when it happened (a sweep's start); `now`: the clock as it reads now (default
    `at`), which the margin before a digest goes out is measured from."""
    not_before = max(at, now or at) + _DIGEST_MARGIN
    for user in sorted(admins):
        digest = outbox.waiting(session, OutboxKind.ADMIN_DIGEST, user, not_before=not_before)
        line = {"subject": subject, "text": text}
        if digest is not None and len(digest.data.get("lines") or []) < DIGEST_MAX_LINES:
            digest.data = {**digest.data, "lines": [*digest.data["lines"], line]}
            session.add(digest)
            continue
        data = {"lines": [line]}
        owe(session, Owed(OutboxKind.ADMIN_DIGEST, "admins", user, data), at=at, after=DIGEST_WAIT)
