"""What an owed message says is read as its subject stands when it goes out, in one read."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import col, select

from bot.services import BorrowAsk, Services
from bot.services.notice_views import (
    ApprovalCard,
    EndedGrant,
    Grant,
    LeaseClosed,
    RequestDecided,
    SettledCard,
)
from storage.outbox import OutboxKind
from storage.tables import OutboxRow
from tests.unit.bot.conftest import ALICE, BOB, VICTOR, borrowed

DAY = timedelta(days=1)


def owed_id(services: Services, kind: OutboxKind, subject: str) -> int:
    with services.db.read() as session:
        stmt = select(OutboxRow.id).where(OutboxRow.kind == kind, OutboxRow.subject == subject)
        found = session.exec(stmt.order_by(col(OutboxRow.id))).first()
    assert found is not None
    return found


def test_a_waiting_request_is_an_approval_card_with_its_numbers(services: Services) -> None:
    """The card of a request that waits carries the quota, the effects and the rules' reason."""
    borrowed(services, ALICE, BorrowAsk("a100", 8, DAY))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2, DAY))
    card = services.notice(
        owed_id(services, OutboxKind.APPROVAL_CARD, f"request:{asked.request.id}")
    )
    assert isinstance(card, ApprovalCard)
    assert ("pending", "a100") == (card.request.state, card.quota.pool)
    assert "2 of these GPUs would be borrowed" in card.because


def test_a_card_that_goes_out_after_its_request_was_settled_has_no_buttons(
    services: Services,
) -> None:
    """Settled before its card went out: the card says so, with the rules' reason."""
    borrowed(services, ALICE, BorrowAsk("a100", 8, DAY))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2, DAY))
    services.deny(VICTOR, asked.request.id, "not now")
    subject = f"request:{asked.request.id}"
    card = services.notice(owed_id(services, OutboxKind.APPROVAL_CARD, subject))
    assert isinstance(card, SettledCard)
    assert ("denied", "") == (card.request.state, card.note)
    assert "2 of these GPUs would be borrowed" in card.because
    redrawn = services.notice(owed_id(services, OutboxKind.CARD_SETTLED, subject))
    assert SettledCard(card.request, note="not now") == redrawn
    told = services.notice(owed_id(services, OutboxKind.REQUEST_DECIDED, subject))
    assert isinstance(told, RequestDecided)
    assert (f"R{asked.request.id}", "deny", VICTOR, "not now", "denied") == (
        told.code,
        told.verdict,
        told.by,
        told.reason,
        told.state,
    )
    assert told.request is not None  # what was asked, restated in the denial DM
    assert (2, "a100") == (told.request.gpus, told.request.pool)


def test_a_grant_of_a_lease_that_ended_says_so_and_closing_it_redraws_nothing_undelivered(
    services: Services,
) -> None:
    """A grant DM still owed for an ended lease offers no buttons; its closing has nothing to
    redraw while no DM of the lease has landed."""
    granted = borrowed(services, ALICE, BorrowAsk("a100", 2, DAY))
    assert granted.lease is not None
    subject = f"lease:{granted.lease.id}"
    grant = services.notice(owed_id(services, OutboxKind.LEASE_GRANTED, subject))
    assert isinstance(grant, Grant)
    services.release(ALICE, granted.lease.id)
    assert isinstance(
        services.notice(owed_id(services, OutboxKind.LEASE_GRANTED, subject)), EndedGrant
    )
    closed = services.notice(owed_id(services, OutboxKind.LEASE_CLOSED, subject))
    assert isinstance(closed, LeaseClosed)
    assert () == closed.redraws


def test_a_notice_that_is_gone_says_nothing(services: Services) -> None:
    """No such outbox row: nothing to say."""
    assert services.notice(10_000) is None
