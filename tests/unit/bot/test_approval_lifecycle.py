"""The approval lifecycle's use cases on SQLite and PostgreSQL: what waits for whom, the
requester's throttled nudge, a second sweep taking no step twice, and Ask again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.services import BorrowAsk, Services
from bot.services.approval_lifecycle import AskedAgain, Nudged, TooSoon, chase
from bot.services.results import BorrowResult, Refused
from rules.domain import Outcome
from storage import audit, outbox
from storage.db import Database
from storage.outbox import OutboxKind
from tests.builders import default_sources
from tests.unit.bot.conftest import (
    ADA,
    ALICE,
    BOB,
    CAROL,
    NADIA,
    VICTOR,
    Clock,
    approved,
    borrowed,
)

LONG = BorrowAsk("a100", 1, timedelta(days=2))  # longer than a day: a manager decides


def test_waiting_for_lists_what_each_person_may_decide_oldest_first(
    services: Services, clock: Clock
) -> None:
    first = borrowed(services, ALICE, LONG)
    clock.advance(timedelta(minutes=5))
    second = borrowed(services, BOB, LONG)
    nlp = borrowed(services, CAROL, LONG)
    assert Outcome.ASK == first.outcome == second.outcome == nlp.outcome
    mine = [first.request.id, second.request.id]
    assert mine == [r.id for r in services.waiting_for(VICTOR)]
    assert [nlp.request.id] == [r.id for r in services.waiting_for(NADIA)]
    assert [*mine, nlp.request.id] == [r.id for r in services.waiting_for(ADA)]
    assert [] == services.waiting_for(ALICE)  # nobody decides their own request
    services.approve(VICTOR, first.request.id)
    assert [second.request.id] == [r.id for r in services.waiting_for(VICTOR)]


def test_a_nudge_is_refused_for_someone_else_and_throttled_for_the_requester(
    services: Services, clock: Clock
) -> None:
    asked = borrowed(services, ALICE, LONG).request.id
    assert isinstance(services.nudge(BOB, asked), Refused)
    done = services.nudge(ALICE, asked)
    assert isinstance(done, Nudged)
    assert (VICTOR,) == done.approvers
    clock.advance(timedelta(minutes=14))
    soon = services.nudge(ALICE, asked)
    assert isinstance(soon, TooSoon)
    assert timedelta(minutes=14) == soon.ago
    assert done.at + timedelta(minutes=15) == soon.again_at
    clock.advance(timedelta(minutes=1))
    assert isinstance(services.nudge(ALICE, asked), Nudged)
    services.approve(VICTOR, asked)
    clock.advance(timedelta(minutes=30))
    assert isinstance(services.nudge(ALICE, asked), Refused)  # settled: nobody to remind


def test_a_second_pass_at_the_same_time_takes_no_step_twice(
    services: Services, clock: Clock
) -> None:
    asked = borrowed(services, ALICE, LONG).request.id
    clock.advance(timedelta(minutes=30))
    assert [f"R{asked} remind"] == chase(services.ctx).steps()
    assert [] == chase(services.ctx).steps()
    clock.advance(timedelta(hours=4))
    assert [f"R{asked} escalate"] == chase(services.ctx).steps()
    assert [] == chase(services.ctx).steps()
    clock.advance(timedelta(hours=2))  # the escalation counts as a reminder: the next is 2 h on
    assert [f"R{asked} remind"] == chase(services.ctx).steps()
    assert [] == chase(services.ctx).steps()
    with services.db.read() as session:
        owed = outbox.owed_about(session, f"request:{asked}")
    # no card has landed here (nothing delivers): each reminder is a DM to the manager (and,
    # once escalated, to the admin too)
    assert 3 == sum(r.kind == OutboxKind.APPROVAL_REMINDER for r in owed)


def test_ask_again_files_the_same_borrow_only_for_its_requester(
    services: Services, clock: Clock
) -> None:
    asked = borrowed(services, ALICE, BorrowAsk("a100", 2, timedelta(days=2), reason="ablation"))
    clock.advance(timedelta(days=1))
    assert [f"R{asked.request.id} expire"] == chase(services.ctx).steps()
    assert isinstance(services.ask_again(BOB, asked.request.id), Refused)
    again = services.ask_again(ALICE, asked.request.id)
    assert isinstance(again, BorrowResult)
    view = again.request
    assert ("a100", 2, timedelta(days=2), "ablation") == (
        view.pool,
        view.gpus,
        view.duration,
        view.reason,
    )
    assert asked.request.id != view.id


def test_ask_again_is_only_for_an_expired_request_and_files_it_once(
    services: Services, clock: Clock
) -> None:
    """Pending, denied or approved requests cannot be asked again; a second click on an
    expired one answers with the request the first filed, and files nothing."""
    pending = borrowed(services, ALICE, LONG).request.id
    assert "not-expired" == refusal_code(services.ask_again(ALICE, pending))
    denied = borrowed(services, ALICE, LONG).request.id
    services.deny(VICTOR, denied, "not now")
    assert "not-expired" == refusal_code(services.ask_again(ALICE, denied))
    granted = borrowed(services, ALICE, BorrowAsk("a100", 1, timedelta(hours=2)))
    assert "not-expired" == refusal_code(services.ask_again(ALICE, granted.request.id))
    clock.advance(timedelta(days=1))
    chase(services.ctx)
    assert "cancelled" == services.request(pending).state  # type: ignore[union-attr]
    first = services.ask_again(ALICE, pending)
    assert isinstance(first, BorrowResult)
    filed = len(services.requests(ALICE))
    second = services.ask_again(ALICE, pending)
    assert isinstance(second, AskedAgain)
    assert (first.request.id, "pending") == (second.request.id, second.request.state)
    assert VICTOR in second.asked
    assert filed == len(services.requests(ALICE))
    services.approve(VICTOR, first.request.id)
    third = services.ask_again(ALICE, pending)
    assert isinstance(third, AskedAgain)
    assert (first.request.id, ()) == (third.request.id, third.asked)
    with services.db.read() as session:
        (row,) = [
            r
            for r in audit.history(session, f"request:{pending}")
            if r.tag == "request:asked-again"
        ]
    assert (ALICE, {"request": first.request.id}) == (row.actor, row.detail)


def refusal_code(result: object) -> str:
    assert isinstance(result, Refused), result
    return result.code


def test_a_team_with_working_hours_is_chased_only_within_them_and_escalates_to_a_channel(
    database: Database,
) -> None:
    """Vision works 09:00-18:00 Berlin on weekdays and escalates to a channel: a request filed
    on Friday at 17:45 is reminded on Monday at 09:15 and 11:15, escalated (a card to the
    channel) once four working hours have passed, and nothing happens over the weekend."""
    sources = default_sources()
    sources["org.yaml"] = sources["org.yaml"].replace(
        "    approval: {channel: C0VAPPROV}   # cards go to this channel",
        "    approval: {channel: C0VAPPROV}\n    approvals:\n"
        "      escalate_to: [C0ESCAL01]\n"
        '      working_hours: {days: mon-fri, from: "09:00", to: "18:00", tz: Europe/Berlin}\n',
    )
    friday = datetime(2026, 3, 6, 16, 45, tzinfo=UTC)  # 17:45 in Berlin
    clock = Clock(friday)
    services = Services.open(database, sources, clock=clock)
    try:
        asked = borrowed(services, ALICE, LONG).request.id
        taken: list[tuple[datetime, str]] = []
        while clock.now < datetime(2026, 3, 9, 12, 0, tzinfo=UTC):
            clock.advance(timedelta(minutes=15))
            taken += [(clock.now, step) for step in chase(services.ctx).steps()]
        assert [
            (datetime(2026, 3, 9, 8, 15, tzinfo=UTC), f"R{asked} remind"),  # Monday 09:15
            (datetime(2026, 3, 9, 10, 15, tzinfo=UTC), f"R{asked} remind"),
            (datetime(2026, 3, 9, 11, 45, tzinfo=UTC), f"R{asked} escalate"),  # 4 working hours
        ] == taken
        with services.db.read() as session:
            cards = [
                r.recipient
                for r in outbox.owed_about(session, f"request:{asked}")
                if r.kind == OutboxKind.APPROVAL_CARD
            ]
        assert ["C0VAPPROV", "C0ESCAL01"] == cards
    finally:
        services.close()


def test_extend_clicked_on_the_first_warning_is_chased_before_the_lease_ends(
    services: Services, clock: Clock
) -> None:
    """Alice clicks Extend on the 60-minute warning of a borrowed lease: her manager is
    reminded after 30 minutes; at the last warning (10 minutes before the end) she hears it
    still waits, and it is escalated to the admins so someone can still answer in time."""
    borrowed(services, ALICE, BorrowAsk("a100", 8, timedelta(hours=2)))
    extra = borrowed(services, ALICE, BorrowAsk("a100", 1, timedelta(hours=2)))
    lease = approved(services, VICTOR, extra).lease
    assert lease is not None
    clock.advance(timedelta(minutes=61))
    asked = services.extend(ALICE, lease.id, timedelta(hours=2))
    assert not isinstance(asked, Refused)
    assert asked.request is not None
    code = asked.request.code
    taken: list[tuple[int, str]] = []
    for minute in range(62, 121):
        clock.advance(timedelta(minutes=1))
        taken += [(minute, step) for step in chase(services.ctx).steps()]
    assert [(91, f"{code} remind"), (110, f"{code} escalate"), (110, f"{code} tell")] == sorted(
        taken
    )


def test_a_person_a_request_is_escalated_to_gets_a_card_and_may_settle_it(
    database: Database, clock: Clock
) -> None:
    """Escalated to a person who was not asked: a card in their DM, and their Approve counts;
    before the escalation the same click was refused."""
    sources = default_sources()
    sources["limits.yaml"] = sources["limits.yaml"].replace(
        "  escalate_to: admins ", f"  escalate_to: [{NADIA}] "
    )
    services = Services.open(database, sources, clock=clock)
    try:
        asked = borrowed(services, ALICE, LONG).request.id
        assert isinstance(services.approve(NADIA, asked), Refused)
        clock.advance(timedelta(hours=4))
        assert f"R{asked} escalate" in chase(services.ctx).steps()
        with services.db.read() as session:
            cards = [
                r.recipient
                for r in outbox.owed_about(session, f"request:{asked}")
                if r.kind == OutboxKind.APPROVAL_CARD
            ]
        assert ["C0VAPPROV", NADIA] == cards
        assert [asked] == [r.id for r in services.waiting_for(NADIA)]
        settled = services.approve(NADIA, asked)
        assert not isinstance(settled, Refused)
        assert "approved" == settled.request.state
    finally:
        services.close()


def test_escalated_to_a_channel_and_a_person_the_admins_settle_and_a_refusal_names_who_may(
    database: Database, clock: Clock
) -> None:
    """From a channel's card the admins settle; anyone else who clicks is told who may,
    the person it was escalated to included."""
    sources = default_sources()
    sources["limits.yaml"] = sources["limits.yaml"].replace(
        "  escalate_to: admins ", f"  escalate_to: [C0ESCAL01, {NADIA}] "
    )
    services = Services.open(database, sources, clock=clock)
    try:
        asked = borrowed(services, ALICE, LONG).request.id
        clock.advance(timedelta(hours=4))
        assert f"R{asked} escalate" in chase(services.ctx).steps()
        refused = services.approve(BOB, asked)
        assert isinstance(refused, Refused)
        assert (
            f"You may not approve or deny R{asked}: you are not a manager of vision, so you "
            f"cannot approve this. Only vision's managers, the gpubot admins and <@{NADIA}> can."
        ) == refused.message
        settled = services.approve(ADA, asked)
        assert not isinstance(settled, Refused)
        assert "approved" == settled.request.state
    finally:
        services.close()
