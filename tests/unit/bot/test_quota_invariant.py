"""Quota as an invariant in code: with rule files that never state the limits (the shipped
rules less `beyond-borrowing-limit` and `lenders-have-too-little`), no borrow, approval, queue
grant or extension takes a team past `nominal + borrowing_limit` or takes more than the
lenders lend; each refusal says why and is audited."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlmodel import col, select

from bot.services import BorrowAsk, Services
from bot.services.grants import grant
from bot.services.results import ExtendResult
from rules.domain import Outcome
from rules.quota import QUOTA_RULE
from storage import requests
from storage.db import Database
from storage.tables import AuditRow
from tests.builders import permissive_sources
from tests.unit.bot.conftest import (
    ADA,
    ALICE,
    BOB,
    CAROL,
    ERIN,
    NADIA,
    VICTOR,
    Clock,
    approved,
    borrowed,
)

DAVE, PAT = "U0DAVE001", "U0PMGR001"
DAY = timedelta(days=1)


@pytest.fixture
def services(database: Database, clock: Clock) -> Iterator[Services]:
    """The use cases on rule files without the quota rules."""
    svc = Services.open(database, permissive_sources(), clock=clock)
    yield svc
    svc.close()


def audit_rows(services: Services, tag: str) -> list[AuditRow]:
    with services.db.read() as session:
        return list(
            session.exec(select(AuditRow).where(AuditRow.tag == tag).order_by(col(AuditRow.id)))
        )


def vision_at_its_limit(services: Services) -> None:
    """a100: vision holds its nominal 8 and borrows its limit of 4 more, approved by Victor."""
    borrowed(services, ALICE, BorrowAsk("a100", 8, DAY))
    approved(services, VICTOR, borrowed(services, BOB, BorrowAsk("a100", 4, DAY)))
    assert 12 == sum(len(lease.gpus) for lease in services.leases(ALICE) + services.leases(BOB))


def test_a_borrow_past_the_teams_limit_is_denied_with_the_limit_and_audited(
    services: Services,
) -> None:
    vision_at_its_limit(services)
    result = borrowed(services, BOB, BorrowAsk("a100", 1, DAY))
    assert (Outcome.DENY, QUOTA_RULE) == (result.outcome, result.deciding)
    assert (
        "team vision would hold 13 GPUs in a100, above its limit of 12 "
        "(nominal 8 + borrowing limit 4)"
    ) == result.because
    denied = audit_rows(services, "borrow:denied")[-1]
    assert (f"request:{result.request.id}", QUOTA_RULE) == (denied.subject, denied.deciding_rule)
    assert 4 == sum(len(lease.gpus) for lease in services.leases(BOB))


def test_an_approval_waits_while_the_lenders_have_too_little_and_the_queue_does_not_grant_it(
    services: Services,
) -> None:
    """nlp borrows all that vision lends (4); the platform manager's borrow of 2 is
    asked, approved by an admin, and waits with the reason, though 2 GPUs are free."""
    borrowed(services, CAROL, BorrowAsk("a100", 6, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("a100", 4, DAY)))
    borrowed(services, ERIN, BorrowAsk("a100", 2, DAY))
    asked = borrowed(services, PAT, BorrowAsk("a100", 2, DAY))
    assert Outcome.ASK == asked.outcome
    effects = services.approval_effects(asked.request.id)
    assert effects is not None
    assert effects.waits  # the card says it will wait, and why
    assert effects.waits_for.endswith(
        "the other teams have no unused GPUs to lend now within their lending limits"
    )
    settled = approved(services, ADA, asked)
    assert settled.lease is None
    assert "queued" == settled.request.state
    assert settled.message.endswith(
        "it waits for its turn: team platform would borrow 2 GPUs in a100, and the other "
        "teams have no unused GPUs to lend now within their lending limits."
    )
    assert [] == services.serve_queue(["a100"])
    assert [] == services.leases(PAT)
    row = audit_rows(services, "borrow:approved")[-1]
    assert QUOTA_RULE in row.matching_rules


def test_an_extension_of_a_team_past_its_limit_is_denied(services: Services) -> None:
    """The admins lower vision's borrowing limit to 2 while it holds 12: it keeps what it has,
    but cannot extend it."""
    vision_at_its_limit(services)
    sources = permissive_sources()
    sources["pools.yaml"] = sources["pools.yaml"].replace(
        "vision:   {nominal: 8, borrowing_limit: 4", "vision:   {nominal: 8, borrowing_limit: 2"
    )
    services.reload_rules(ADA, sources)
    lease = services.leases(ALICE)[0]
    result = services.extend(ALICE, lease.id, timedelta(hours=1))
    assert isinstance(result, ExtendResult), result
    assert (Outcome.DENY, QUOTA_RULE) == (result.outcome, result.deciding)
    assert result.because.startswith(
        "team vision would hold 12 GPUs in a100, above its limit of 10"
    )


def test_a_grant_past_the_limit_is_refused_and_audited_whatever_decided_it(
    services: Services, clock: Clock
) -> None:
    """The last check, in `grant` itself: a request the rules were never asked about again."""
    vision_at_its_limit(services)
    denied = borrowed(services, BOB, BorrowAsk("a100", 1, DAY))
    with services.db.write() as session:
        row = requests.get(session, denied.request.id)
        assert row is not None
        assert grant(services.ctx, session, row, clock(), actor="test", decision=None) is None
    (refused,) = audit_rows(services, "quota:refused")
    assert (f"request:{denied.request.id}", "deny") == (refused.subject, refused.outcome)
    assert refused.detail["because"].startswith("team vision would hold 13 GPUs")
