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
    lease_warning    expiry, idle or unhealthy, before anything is taken (buttons to answer)
    lease_reclaimed  the lease was reclaimed, and why
    recall_withdrawn the lease warned of preemption stays: its recall is no longer needed
    unreserved_use   a process runs on a GPU no lease covers: offer a borrow
    admin_notice     a line for each admin (faults, would-haves, unreserved use, devices)
    notice           a line for one person (someone else runs on their leased GPU, ...)
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
    data = {"request": request.id, "by": by, "verdict": verdict, "reason": reason}
    owe(session, Owed(OutboxKind.CARD_SETTLED, subject, CARDS, data), at=at)
    if tell_requester:
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
    for request in requests.pending_with_card(session, pool):
        if request.id != besides:
            redraw(
                session,
                card_redrawn(request, by=""),
                at=at,
                again=True,
                after=CARD_NUMBERS_EVERY,
            )


def recall_withdrawn(session: Session, lease: LeaseRow, *, at: datetime) -> None:
    data = {"lease": lease.id}
    owe(session, Owed(OutboxKind.RECALL_WITHDRAWN, f"lease:{lease.id}", lease.holder, data), at=at)


def tell(session: Session, user: str, subject: str, text: str, *, at: datetime) -> None:
    """A one-off notice to one person (rendered like an admin notice)."""
    owe(session, Owed(OutboxKind.NOTICE, subject, user, {"text": text}), at=at)


def tell_admins(
    session: Session, admins: Iterable[str], subject: str, text: str, *, at: datetime
) -> None:
    for user in sorted(admins):
        owe(session, Owed(OutboxKind.ADMIN_NOTICE, subject, user, {"text": text}), at=at)
