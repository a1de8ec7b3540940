"""Fair sharing at the use cases: lending limits across borrowers, approvals that answer `ask`
and nothing else, extensions that cannot outrun their limits or a recall, and recalls that
follow the queue as it changes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlmodel import select

from bot.services import BorrowAsk, Services, recall
from bot.services.grants import queue_of
from bot.services.notice_views import LeaseWarning, Reclaimed
from bot.services.results import (
    BorrowResult,
    ExtendResult,
    HeldFor,
    Recalled,
    Refused,
    SettleResult,
)
from bot.telemetry.window import TelemetryWindow
from rules.domain import Outcome, Priority
from storage import audit, outbox
from storage.audit import AuditTag
from storage.db import Database
from storage.outbox import OutboxKind
from storage.tables import AuditRow, OutboxRow
from tests.builders import default_sources
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

pytestmark = pytest.mark.usefixtures("services")
DAVE, PAT = "U0DAVE001", "U0PMGR001"
DAY = timedelta(days=1)


def lent_out(services: Services, clock: Clock) -> int:
    """l40s: Carol holds nlp's nominal 3, Dave 2 more on loan, Erin platform's 2; an hour on,
    Alice asks for vision's nominal 3 and Dave's lease is recalled. Dave's lease id."""
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY)))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=61))
    assert Outcome.QUEUE == borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY)).outcome
    dave = services.leases(DAVE)[0]
    assert dave.recalled_for.startswith("vision")
    return dave.id


def test_an_approval_answers_ask_but_a_borrow_still_waits_for_lenders(services: Services) -> None:
    """a100: vision lends at most 4 and nlp already borrows them; platform's borrow of 2 is
    approved by its manager, yet it waits, as the lenders have nothing left."""
    borrowed(services, CAROL, BorrowAsk("a100", 6, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("a100", 4, DAY)))
    borrowed(services, ERIN, BorrowAsk("a100", 2, DAY))
    asked = borrowed(services, PAT, BorrowAsk("a100", 2, DAY))
    assert Outcome.ASK == asked.outcome
    effects = services.approval_effects(asked.request.id)  # what the card says
    assert effects is not None
    assert effects.waits
    assert "other teams have no unused GPUs to lend" in effects.waits_for
    settled = approved(services, ADA, asked)
    assert "queued" == settled.request.state
    assert "other teams have no unused GPUs to lend" in settled.message
    assert [] == services.leases(PAT)


def test_a_second_extension_waits_for_the_first_and_the_limits_hold(
    services: Services,
) -> None:
    """Carol's nlp lease while nlp borrows: each extension asks Nadia. A second request while
    one waits is refused, so approvals can never add up past the limits."""
    lease = borrowed(services, CAROL, BorrowAsk("a100", 6, DAY)).lease
    assert lease is not None
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("a100", 2, DAY)))
    for _ in range(2):
        first = services.extend(CAROL, lease.id, timedelta(hours=10))
        assert isinstance(first, ExtendResult)
        assert first.request is not None
        assert Outcome.ASK == first.outcome
        second = services.extend(CAROL, lease.id, timedelta(hours=10))
        assert isinstance(second, Refused)
        assert f"already has an extension waiting for approval (R{first.request.id})" in (
            second.message
        )
        settled = services.approve(NADIA, first.request.id)
        assert isinstance(settled, SettleResult)
        assert settled.lease is not None
    third = services.extend(CAROL, lease.id, timedelta(hours=10))
    assert isinstance(third, ExtendResult)
    assert Outcome.DENY == third.outcome
    view = services.lease(lease.id)
    assert view is not None
    assert (2, timedelta(hours=20)) == (view.extensions, view.extended)


def test_an_extension_approved_after_a_recall_is_denied(services: Services, clock: Clock) -> None:
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY)))
    dave = services.leases(DAVE)[0].id
    pending = services.extend(DAVE, dave, timedelta(hours=2))
    assert isinstance(pending, ExtendResult)
    assert pending.request is not None
    assert Outcome.ASK == pending.outcome
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=61))
    borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY))
    settled = services.approve(NADIA, pending.request.id)
    assert isinstance(settled, SettleResult)
    assert settled.lease is None
    assert f"L{dave} is being recalled" in settled.message


def test_a_later_high_priority_lease_survives_while_an_earlier_low_priority_one_is_recalled(
    services: Services, clock: Clock
) -> None:
    """l40s: Carol took nlp's 3 at low priority, then Dave 2 more at high priority. nlp's
    nominal covers its high-priority lease first, so Carol's holds the borrowed share and is
    recalled for Alice's guarantee, although Dave's was granted later."""
    low, high = Priority.LOW, Priority.HIGH
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY, priority=low))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY, priority=high)))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=61))
    alice = borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY))
    assert Outcome.QUEUE == alice.outcome
    assert f"vision (R{alice.request.id})" == services.leases(CAROL)[0].recalled_for
    assert "" == services.leases(DAVE)[0].recalled_for


def test_withdrawing_the_request_by_releasing_everything_withdraws_its_recall(
    services: Services, clock: Clock
) -> None:
    dave = lent_out(services, clock)
    services.release(ALICE)  # Alice holds nothing: this withdraws her queued request
    view = services.lease(dave)
    assert view is not None
    assert "" == view.recalled_for


def test_paused_automation_starts_no_recall(services: Services, clock: Clock) -> None:
    assert isinstance(services.pause(ADA), str)
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY)))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=61))
    borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY))
    assert "" == services.leases(DAVE)[0].recalled_for
    assert isinstance(services.resume(ADA), str)
    services.serve_queue(["l40s"])
    assert services.leases(DAVE)[0].recalled_for.startswith("vision")


def test_the_queue_says_why_each_request_waits_as_things_are_now(
    services: Services, clock: Clock
) -> None:
    lent_out(services, clock)
    (entry,) = services.queue_explained()
    assert "only 1 of 8 GPUs are free in l40s right now" == entry.waits_for
    for node in ("l40s-node-01", "l40s-node-02"):
        assert isinstance(services.drain(ADA, node), str)
    (entry,) = services.queue_explained()
    assert "only 0 of 8 GPUs are free in l40s right now" == entry.waits_for


def test_the_queue_and_why_explain_a_borrowed_lease_too_young_to_recall(
    services: Services, clock: Clock
) -> None:
    """Alice asks for vision's nominal 30 minutes after Dave borrowed: his lease, the only
    borrowed one, is too young, and the queue and `why` say so instead of a bare "nothing can
    be recalled"; once it is old enough, it is recalled."""
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY)))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=30))
    alice = borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY))
    dave = services.leases(DAVE)[0].id
    (entry,) = services.queue_explained()
    assert (entry.guaranteed, entry.recalls) == (True, ())
    ((lease, reason),) = [(p.lease, p.why) for p in entry.passed_over]
    assert (dave, DAVE, 2, "nlp") == (lease.lease, lease.holder, lease.gpus, lease.team)
    assert "too young to recall for another 30m (minimum runtime 1h)" == reason
    why = services.why(ADA, f"R{alice.request.id}")
    assert not isinstance(why, Refused)
    assert entry.passed_over == why.passed_over
    clock.advance(timedelta(minutes=31))
    services.serve_queue(["l40s"])
    assert f"vision (R{alice.request.id})" == services.lease(dave).recalled_for  # type: ignore[union-attr]
    why = services.why(ADA, f"R{alice.request.id}")
    assert not isinstance(why, Refused)
    assert () == why.passed_over


def test_a_recall_whose_request_went_stands_for_the_next_one_that_needs_it(
    services: Services, clock: Clock
) -> None:
    """a100 is full: nlp holds 6 and Dave 4 more on loan, Erin 2, Bob 4 of vision's 8. Alice
    asks for 4 more inside vision's nominal: Dave's lease is recalled for her. Victor's 2 wait
    behind her, beyond what vision may count on while she waits. Alice withdraws: Victor's 2
    are now inside the nominal, so the recall stands, for him."""
    borrowed(services, CAROL, BorrowAsk("a100", 6, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("a100", 4, DAY)))
    borrowed(services, ERIN, BorrowAsk("a100", 2, DAY))
    borrowed(services, BOB, BorrowAsk("a100", 4, DAY))
    clock.advance(timedelta(minutes=61))
    alice = borrowed(services, ALICE, BorrowAsk("a100", 4, DAY))
    victor = borrowed(services, VICTOR, BorrowAsk("a100", 2, DAY))
    assert Outcome.QUEUE == alice.outcome == victor.outcome
    dave = services.leases(DAVE)[0].id
    assert f"vision (R{alice.request.id})" == services.lease(dave).recalled_for  # type: ignore[union-attr]
    assert not isinstance(services.cancel(ALICE, alice.request.id), Refused)
    assert f"vision (R{victor.request.id})" == services.lease(dave).recalled_for  # type: ignore[union-attr]
    why = services.why(ADA, f"R{victor.request.id}")
    assert not isinstance(why, Refused)
    assert any(f"the recall stands, now for R{victor.request.id}" in line for line in why.lines)


def test_the_queue_wait_counts_from_the_approval_not_the_ask(
    services: Services, clock: Clock
) -> None:
    """Platform's borrow waited 23h for a manager; approved, it waits for lenders, and is
    withdrawn a day after the approval, not an hour after it."""
    for user, gpus, manager in ((CAROL, 6, NADIA), (DAVE, 4, NADIA), (ERIN, 2, PAT)):
        approved(services, manager, borrowed(services, user, BorrowAsk("a100", gpus, 3 * DAY)))
    asked = borrowed(services, PAT, BorrowAsk("a100", 2, DAY))
    clock.advance(timedelta(hours=23))
    assert "queued" == approved(services, ADA, asked).request.state
    clock.advance(timedelta(hours=2))
    services.serve_queue(["a100"])
    assert "queued" == services.request(asked.request.id).state  # type: ignore[union-attr]
    clock.advance(timedelta(hours=23))
    services.serve_queue(["a100"])
    assert "cancelled" == services.request(asked.request.id).state  # type: ignore[union-attr]


def test_a_borrowed_lease_on_a_drained_node_is_not_recalled(
    services: Services, clock: Clock
) -> None:
    """Its GPUs would not come back to the queue: reclaiming them would serve nobody."""
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY)))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    (node,) = {slot.node for slot in services.leases(DAVE)[0].gpus}
    assert isinstance(services.drain(ADA, node), str)
    clock.advance(timedelta(minutes=61))
    borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY))
    assert "" == services.leases(DAVE)[0].recalled_for


def test_a_holder_warned_then_spared_is_not_recalled_again_within_the_cooldown(
    services: Services, clock: Clock
) -> None:
    dave = lent_out(services, clock)
    with services.db.write() as session:  # the preemption warning reached Dave
        for row in session.exec(select(OutboxRow)).all():
            outbox.delivered(session, row.id or 0, at=clock.now, channel="D0DAVE", ts="1.0")
    services.sweep(TelemetryWindow(timedelta(minutes=3)))
    with services.db.write() as session:
        for row in session.exec(select(OutboxRow)).all():
            outbox.delivered(session, row.id or 0, at=clock.now, channel="D0DAVE", ts="1.0")
    services.release(CAROL)  # Alice is served from Carol's GPUs: Dave's recall is withdrawn
    assert "" == services.lease(dave).recalled_for  # type: ignore[union-attr]
    services.release(DAVE)  # and whatever Dave holds next, in any pool, is spared a day
    clock.advance(timedelta(hours=23))
    with services.db.read() as session:
        for pool in ("a100", "l40s"):
            seen = recall.picture(services.ctx, session, pool, clock.now)
            assert DAVE in seen.cooled
    clock.advance(timedelta(hours=2))
    with services.db.read() as session:
        assert DAVE not in recall.picture(services.ctx, session, "a100", clock.now).cooled


def test_a_guarantee_waits_for_the_cooldown_no_longer_than_the_bound(
    services: Services, clock: Clock
) -> None:
    """Dave was warned and spared, so the cooldown shields his next loan; when Alice's
    guarantee has waited recall.max_guarantee_wait (30m), his lease is recalled anyway."""
    dave = lent_out(services, clock)
    with services.db.write() as session:  # the preemption warning reached Dave
        for row in session.exec(select(OutboxRow)).all():
            outbox.delivered(session, row.id or 0, at=clock.now, channel="D0DAVE", ts="1.0")
    services.sweep(TelemetryWindow(timedelta(minutes=3)))
    with services.db.write() as session:
        for row in session.exec(select(OutboxRow)).all():
            outbox.delivered(session, row.id or 0, at=clock.now, channel="D0DAVE", ts="1.0")
    services.release(CAROL)  # Alice is served from Carol's GPUs: Dave's recall is withdrawn
    assert "" == services.lease(dave).recalled_for  # type: ignore[union-attr]
    services.release(DAVE)
    services.release(ALICE)
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY)))
    clock.advance(timedelta(minutes=61))
    assert Outcome.QUEUE == borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY)).outcome
    assert "" == services.leases(DAVE)[0].recalled_for  # the cooldown holds, for now
    clock.advance(timedelta(minutes=29))
    recall.reconcile(services.ctx)
    assert "" == services.leases(DAVE)[0].recalled_for
    clock.advance(timedelta(minutes=1))
    recall.reconcile(services.ctx)
    lease = services.leases(DAVE)[0]
    assert lease.recalled_for.startswith("vision")
    with services.db.read() as session:
        audited = session.exec(
            select(AuditRow).where(
                AuditRow.tag == AuditTag.LEASE_RECALLED, AuditRow.subject == f"lease:{lease.id}"
            )
        ).one()
    assert str(audited.detail["because"]).endswith(
        "waited 30m, past recall.max_guarantee_wait (30m); cooldown overridden"
    )


def test_an_approval_cannot_lend_what_a_waiting_guarantee_counts_on(services: Services) -> None:
    """a100: nlp borrows 2 of vision's unused 8, platform holds its nominal 2, 6 GPUs are free.
    Alice asks for vision's whole nominal and waits; platform's borrow of 2 more is approved,
    yet it may not take the free GPUs Alice's guarantee counts on."""
    borrowed(services, CAROL, BorrowAsk("a100", 6, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("a100", 2, DAY)))
    borrowed(services, ERIN, BorrowAsk("a100", 2, DAY))
    alice = borrowed(services, ALICE, BorrowAsk("a100", 8, DAY))
    assert Outcome.QUEUE == alice.outcome
    asked = borrowed(services, PAT, BorrowAsk("a100", 2, DAY))
    assert Outcome.ASK == asked.outcome
    effects = services.approval_effects(asked.request.id)
    assert effects is not None
    assert effects.waits
    assert "other teams have no unused GPUs to lend" in effects.waits_for
    assert (HeldFor(alice.request.id, "vision", 8),) == effects.held_for  # the card says so
    settled = approved(services, ADA, asked)
    assert "queued" == settled.request.state
    assert [] == services.leases(PAT)


def delivered(services: Services, at: Clock, channel: str) -> None:
    """Every message owed so far reached Slack."""
    with services.db.write() as session:
        for row in session.exec(select(OutboxRow)).all():
            if row.delivered_at is None:
                outbox.delivered(session, row.id or 0, at=at.now, channel=channel, ts="1.0")


@pytest.fixture
def preempting(database: Database, clock: Clock) -> Iterator[Services]:
    """The use cases on the shipped rules with `preemption: {within_team: lower_priority}`."""
    sources = default_sources()
    sources["limits.yaml"] = sources["limits.yaml"].replace(
        "within_team: off", "within_team: lower_priority"
    )
    svc = Services.open(database, sources, clock=clock)
    yield svc
    svc.close()


def vision_full(
    services: Services, clock: Clock, after: timedelta = timedelta(minutes=61)
) -> tuple[int, BorrowResult]:
    """l40s full, nothing borrowed: Bob holds vision's 3 at low priority, nlp and platform
    their nominals. An hour on, Alice asks for 2 at high priority; Victor approves and she
    waits. Bob's lease id and Alice's request."""
    bob = borrowed(services, BOB, BorrowAsk("l40s", 3, DAY, priority=Priority.LOW)).lease
    assert bob is not None
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(after)
    alice = borrowed(services, ALICE, BorrowAsk("l40s", 2, DAY, priority=Priority.HIGH))
    assert Outcome.ASK == alice.outcome
    effects = services.approval_effects(alice.request.id)  # what Victor's card says
    assert effects is not None
    young = after < timedelta(hours=1)
    preempts = () if effects.paused or young else (Recalled(bob.id, BOB, 3, "vision"),)
    assert ((), preempts) == (effects.recalls, effects.preempts)
    assert "queued" == approved(services, VICTOR, alice).request.state
    return bob.id, alice


def test_a_high_priority_request_preempts_a_low_priority_lease_of_its_own_team(
    preempting: Services, clock: Clock
) -> None:
    """Alice's request waits with nothing borrowed to recall: Bob's lease is preempted for
    her, warned, reclaimed after the notice, and her request granted. The queue and `why`
    show the preemption."""
    services = preempting  # the shipped rules with preemption within teams turned on
    bob_id, alice = vision_full(services, clock)
    code = f"R{alice.request.id}"
    assert f"vision ({code})" == services.lease(bob_id).recalled_for  # type: ignore[union-attr]
    with services.db.read() as session:
        audited = session.exec(
            select(AuditRow).where(
                AuditRow.tag == AuditTag.LEASE_RECALLED, AuditRow.subject == f"lease:{bob_id}"
            )
        ).one()
    assert str(audited.detail["because"]).startswith(
        f"preempted for {code}, a high-priority request of your team vision"
    )
    (entry,) = services.queue_explained()
    assert [(bob_id, True)] == [(r.lease.lease, r.within_team) for r in entry.recalls]
    refused = services.extend(BOB, bob_id, timedelta(hours=2))
    assert isinstance(refused, Refused)
    assert f"{code}, a higher-priority request of your team, needs its GPUs" in refused.message
    why = services.why(ADA, code)
    assert not isinstance(why, Refused)
    assert any(f"preempted for {code}" in line for line in why.lines)

    delivered(services, clock, "D0BOB")
    services.sweep(TelemetryWindow(timedelta(minutes=3)))  # warn preempt
    delivered(services, clock, "D0BOB")
    with services.db.read() as session:
        warning = session.exec(
            select(OutboxRow).where(
                OutboxRow.recipient == BOB, OutboxRow.kind == OutboxKind.LEASE_WARNING
            )
        ).one()
    notice = services.notice(warning.id or 0)  # what the holder's DM is drawn from
    assert isinstance(notice, LeaseWarning)
    assert notice.recall is not None
    assert notice.recall["within_team"]
    clock.advance(timedelta(minutes=29))
    services.sweep(TelemetryWindow(timedelta(minutes=3)))
    assert "active" == services.lease(bob_id).state  # type: ignore[union-attr]
    clock.advance(timedelta(minutes=1))
    services.sweep(TelemetryWindow(timedelta(minutes=3)))  # reclaim preempted
    services.serve_queue(["l40s"])
    assert "reclaimed" == services.lease(bob_id).state  # type: ignore[union-attr]
    with services.db.read() as session:
        told = session.exec(
            select(OutboxRow).where(
                OutboxRow.recipient == BOB, OutboxRow.kind == OutboxKind.LEASE_RECLAIMED
            )
        ).one()
    reclaimed = services.notice(told.id or 0)
    assert isinstance(reclaimed, Reclaimed)
    assert reclaimed.within_team
    assert reclaimed.because.startswith(f"preempted for {code}")
    assert "approved" == services.request(alice.request.id).state  # type: ignore[union-attr]
    assert 1 == len(services.leases(ALICE))


def test_paused_automation_preempts_nobody_within_a_team_and_says_what_it_would_have_done(
    preempting: Services, clock: Clock
) -> None:
    assert isinstance(preempting.pause(ADA), str)
    bob, alice = vision_full(preempting, clock)
    assert "" == preempting.lease(bob).recalled_for  # type: ignore[union-attr]
    with preempting.db.read() as session:
        (would,) = session.exec(
            select(AuditRow).where(AuditRow.tag == AuditTag.RECALL_WOULD_HAVE)
        ).all()
    assert f"lease:{bob}" == would.subject
    assert f"preempted for R{alice.request.id}" in str(would.detail)


def test_the_queue_explains_a_lease_of_the_team_too_young_to_preempt(
    preempting: Services, clock: Clock
) -> None:
    bob, alice = vision_full(preempting, clock, after=timedelta(minutes=30))
    (entry,) = preempting.queue_explained()
    assert () == entry.recalls
    ((lease, why),) = [(p.lease, p.why) for p in entry.passed_within]
    assert (bob, BOB, "vision") == (lease.lease, lease.holder, lease.team)
    assert "too young to recall for another 30m (minimum runtime 1h)" == why
    clock.advance(timedelta(minutes=31))
    preempting.serve_queue(["l40s"])
    assert f"vision (R{alice.request.id})" == preempting.lease(bob).recalled_for  # type: ignore[union-attr]
    (entry,) = preempting.queue_explained()
    assert ((bob,), ()) == (tuple(r.lease.lease for r in entry.recalls), entry.passed_within)


def test_within_team_preemption_is_off_with_the_shipped_rules(
    services: Services, clock: Clock
) -> None:
    borrowed(services, BOB, BorrowAsk("l40s", 3, DAY, priority=Priority.LOW))
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=61))
    alice = borrowed(services, ALICE, BorrowAsk("l40s", 2, DAY, priority=Priority.HIGH))
    assert "queued" == approved(services, VICTOR, alice).request.state
    assert "" == services.leases(BOB)[0].recalled_for


def test_a_borrowed_lease_ending_within_the_notice_is_left_to_end(
    services: Services, clock: Clock
) -> None:
    """l40s: Dave's loan ends 80 minutes in. At minute 61 Alice asks for vision's 3 with 1
    free: Dave's 2 come back before a recall's notice would run out, so nobody is preempted;
    once his lease ends, the queue serves Alice."""
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, timedelta(minutes=80))))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    clock.advance(timedelta(minutes=61))
    alice = borrowed(services, ALICE, BorrowAsk("l40s", 3, DAY))
    assert Outcome.QUEUE == alice.outcome
    assert "" == services.leases(DAVE)[0].recalled_for
    (entry,) = services.queue_explained()
    assert clock() + timedelta(minutes=19, seconds=0) == entry.expected_start


def test_a_recall_moves_to_the_next_guarantee_when_its_request_goes(
    services: Services, database: Database, clock: Clock
) -> None:
    """Dave's loan is recalled for Alice's request inside vision's nominal; when she cancels
    it, the recall stands for Bob's, which waited beyond the nominal and is inside it now:
    the lease's marks and one `lease:recall_reassigned` row say so, chained like any row."""
    borrowed(services, CAROL, BorrowAsk("l40s", 3, DAY))
    approved(services, NADIA, borrowed(services, DAVE, BorrowAsk("l40s", 2, DAY)))
    borrowed(services, ERIN, BorrowAsk("l40s", 2, DAY))
    borrowed(services, BOB, BorrowAsk("l40s", 1, DAY))
    clock.advance(timedelta(minutes=61))
    first = borrowed(services, ALICE, BorrowAsk("l40s", 2, DAY))
    second = borrowed(services, BOB, BorrowAsk("l40s", 1, DAY))
    assert (Outcome.QUEUE, Outcome.QUEUE) == (first.outcome, second.outcome)
    dave = services.leases(DAVE)[0]
    assert f"vision (R{first.request.id})" == dave.recalled_for
    services.cancel(ALICE, first.request.id)
    assert f"vision (R{second.request.id})" == services.leases(DAVE)[0].recalled_for
    with database.read() as session:
        moved = session.exec(
            select(AuditRow).where(AuditRow.tag == AuditTag.LEASE_RECALL_REASSIGNED)
        ).all()
        assert audit.verify(session).ok
    assert [(f"lease:{dave.id}", "recall", second.request.id, "vision")] == [
        (row.subject, row.outcome, row.detail["request"], row.detail["for_team"]) for row in moved
    ]


def test_the_queue_marks_as_inside_nominal_exactly_the_requests_recall_guarantees(
    services: Services, database: Database, clock: Clock
) -> None:
    """`/gpu why R` weighs the whole pool only for a guarantee, told by the queue's own
    inside-nominal mark: for every waiting request the mark and the recall plan agree, for
    requests inside and beyond their team's nominal alike."""
    lent_out(services, clock)
    for user, gpus in ((BOB, 1), (ALICE, 2)):  # beyond vision's nominal, with Alice's first
        assert Outcome.QUEUE == borrowed(services, user, BorrowAsk("l40s", gpus, DAY)).outcome
    ctx, now = services.ctx, services.ctx.now()
    with database.read() as session:
        ordered = queue_of(ctx, session, "l40s")
        plan = recall.plan_for(ctx, recall.picture(ctx, session, "l40s", now), "l40s", now)
    marked = {row.id for row, inside in ordered if inside}
    assert {True, False} == {inside for _, inside in ordered}
    assert marked == set(plan.guaranteed)
    with database.read() as session:
        told = {
            row.id: recall.waiting_guarantee(ctx, session, row) is not None for row, _ in ordered
        }
    assert {request: request in marked for request in told} == told
