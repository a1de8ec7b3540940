"""Pause means pause: while automation is paused, queue timeouts and lender recalls are
recorded as "would have" (once, with a word to the admins) and nothing else happens; after
resume they happen as usual, and a request's own timeout is not lost."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import col, select

from bot.services import BorrowAsk, Services
from bot.services.results import SettleResult
from rules.domain import Outcome
from storage.db import Database
from storage.tables import AuditRow, OutboxRow
from tests.builders import default_sources
from tests.unit.bot.conftest import ADA, ALICE, CAROL, ERIN, NADIA, Clock, borrowed

pytestmark = pytest.mark.usefixtures("services")
DAVE = "U0DAVE001"
DAY = timedelta(days=1)


def rows(services: Services, tag: str) -> list[AuditRow]:
    with services.db.read() as session:
        return list(session.exec(select(AuditRow).where(AuditRow.tag == tag)))


def admin_notices(services: Services) -> list[str]:
    with services.db.read() as session:
        found = session.exec(
            select(OutboxRow).where(OutboxRow.kind == "admin_digest").order_by(col(OutboxRow.id))
        )
        return [str(line["text"]) for row in found for line in row.data["lines"]]


def waiting_in_full_a100(services: Services) -> int:
    """a100 is full (vision 8, nlp 6 + 2 borrowed); Erin waits for 1. Her request's id."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    borrowed(services, CAROL, BorrowAsk("a100", 6))
    asked = borrowed(services, DAVE, BorrowAsk("a100", 2))
    assert isinstance(services.approve(NADIA, asked.request.id), SettleResult)
    waiting = borrowed(services, ERIN, BorrowAsk("a100", 1))
    assert Outcome.QUEUE == waiting.outcome
    return waiting.request.id


def test_a_paused_queue_timeout_is_recorded_once_and_the_request_keeps_waiting(
    services: Services, clock: Clock
) -> None:
    request = waiting_in_full_a100(services)
    assert isinstance(services.pause(ADA), str)
    clock.advance(timedelta(hours=25))
    services.serve_queue()
    services.serve_queue()  # a second pass records nothing new
    assert "queued" == services.request(request).state  # type: ignore[union-attr]
    (row,) = rows(services, "queue:would-have")
    assert (f"request:{request}", "would cancel") == (row.subject, row.outcome)
    assert [] == rows(services, "queue:timed-out")
    withdrawn = {t for t in admin_notices(services) if "withdrawn" in t}  # one per admin
    assert {
        f"Automation is paused: R{request} would have been withdrawn from the a100 queue: "
        "it waited longer than 1d for free GPUs."
    } == withdrawn


def test_after_resume_a_request_past_its_wait_is_withdrawn_at_the_next_pass(
    services: Services, clock: Clock
) -> None:
    request = waiting_in_full_a100(services)
    assert isinstance(services.pause(ADA), str)
    clock.advance(timedelta(hours=25))
    services.serve_queue()
    assert isinstance(services.resume(ADA), str)
    services.serve_queue()
    assert "cancelled" == services.request(request).state  # type: ignore[union-attr]
    assert 1 == len(rows(services, "queue:timed-out"))


def test_a_paused_recall_is_recorded_once_and_warns_nobody(
    services: Services, clock: Clock
) -> None:
    """l40s: Dave borrows 2 of vision's nominal; Alice asks for vision's 3 while paused."""
    assert isinstance(services.pause(ADA), str)
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    asked = borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY))
    assert isinstance(services.approve(NADIA, asked.request.id), SettleResult)
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=61))
    borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY))
    services.serve_queue(["l40s"])
    services.serve_queue(["l40s"])  # a second pass records nothing new
    dave = services.leases(DAVE)[0]
    assert "" == dave.recalled_for
    (row,) = rows(services, "recall:would-have")
    assert (f"lease:{dave.id}", "would recall") == (row.subject, row.outcome)
    assert [] == rows(services, "lease:recalled")
    assert any(
        f"L{dave.id}" in t and "would have been recalled" in t for t in admin_notices(services)
    )
    assert isinstance(services.resume(ADA), str)
    services.serve_queue(["l40s"])
    assert services.leases(DAVE)[0].recalled_for.startswith("vision")


def test_paused_by_the_rule_files_a_timeout_waits_for_the_rules_to_resume(
    database: Database, clock: Clock
) -> None:
    """`automation: paused` in the rule files: recorded once; a reload to `active` resumes."""
    sources = default_sources()
    sources["limits.yaml"] = sources["limits.yaml"].replace(
        "automation: active", "automation: paused"
    )
    services = Services.open(database, sources, clock=clock)
    try:
        request = waiting_in_full_a100(services)
        clock.advance(timedelta(hours=25))
        services.serve_queue()
        services.serve_queue()
        assert "queued" == services.request(request).state  # type: ignore[union-attr]
        assert 1 == len(rows(services, "queue:would-have"))
        services.reload_rules(ADA, default_sources())
        services.serve_queue()
        assert "cancelled" == services.request(request).state  # type: ignore[union-attr]
    finally:
        services.close()
