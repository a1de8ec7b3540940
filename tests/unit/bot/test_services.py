"""The use cases end to end on a real database: borrow, approve, deny, extend, release, why."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import col, select

from bot.services import BorrowAsk, Refused, Services
from bot.services.results import ExtendResult, ReleaseResult, SettleResult
from rules.domain import Outcome, Priority
from storage import audit
from storage.tables import AuditRow, GpuRow, NodeRow
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, ERIN, NADIA, VICTOR, Clock, borrowed

pytestmark = pytest.mark.usefixtures("services")


def tags(services: Services) -> list[str]:
    with services.db.read() as session:
        return [r.tag for r in session.exec(select(AuditRow).order_by(col(AuditRow.id))).all()]


def test_the_inventory_follows_the_rule_files(services: Services) -> None:
    """Pools, nodes and GPUs named in the rules exist in the database."""
    with services.db.read() as session:
        nodes = {n.name: n.pool for n in session.exec(select(NodeRow)).all()}
        gpus = session.exec(select(GpuRow)).all()
    assert "a100" == nodes["a100-node-01"]
    assert 16 + 8 + 4 == len(gpus)
    assert "inventory:synced" == tags(services)[0]
    assert [] == services.sync_inventory()  # idempotent


def test_a_borrow_inside_nominal_is_granted_on_one_node(services: Services) -> None:
    """approve places the GPUs best-fit on one node and audits decision and grant."""
    result = borrowed(services, ALICE, BorrowAsk("a100", 2, timedelta(hours=6), reason="ablations"))
    assert Outcome.APPROVE == result.outcome
    assert "within-nominal" == result.deciding
    assert result.lease is not None
    assert 1 == len(result.lease.by_node)
    assert "0,1" == result.lease.cuda_visible_devices(next(iter(result.lease.by_node)))
    assert timedelta(hours=6) == result.lease.expires_at - result.lease.granted_at
    assert ["inventory:synced", "borrow:approved", "lease:granted"] == tags(services)


def test_placement_prefers_the_fuller_node(services: Services) -> None:
    """A second small borrow lands beside the first rather than opening another node."""
    first = borrowed(services, ALICE, BorrowAsk("a100", 3))
    second = borrowed(services, BOB, BorrowAsk("a100", 2))
    assert first.lease is not None
    assert second.lease is not None
    assert first.lease.by_node.keys() == second.lease.by_node.keys()
    assert set(first.lease.gpus).isdisjoint(second.lease.gpus)


def test_borrowing_beyond_nominal_asks_the_teams_managers(services: Services) -> None:
    """ask creates a pending request naming who may approve, and no lease."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    result = borrowed(services, BOB, BorrowAsk("a100", 2, reason="sweep"))
    assert Outcome.ASK == result.outcome
    assert result.lease is None
    assert "pending" == result.request.state
    assert (VICTOR, ADA) == result.request.approvers
    assert "C0VAPPROV" == result.request.approval_route
    assert "2 of these GPUs would be borrowed" in result.because


def test_a_manager_approves_and_the_lease_is_granted(services: Services) -> None:
    """Approve settles the request and places the GPUs."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    settled = services.approve(VICTOR, asked.request.id)
    assert isinstance(settled, SettleResult)
    assert settled.lease is not None
    assert ("approved", VICTOR) == (settled.request.state, settled.request.decided_by)
    assert ["borrow:approved", "lease:granted"] == tags(services)[-2:]


def test_nobody_approves_their_own_request(services: Services) -> None:
    """Even a manager's own over-quota request waits for another approver."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, VICTOR, BorrowAsk("a100", 2))
    refused = services.approve(VICTOR, asked.request.id)
    assert isinstance(refused, Refused)
    assert "their own request" in refused.message
    assert "approval:refused" == tags(services)[-1]
    assert isinstance(services.approve(ADA, asked.request.id), SettleResult)


def test_another_teams_manager_may_not_approve(services: Services) -> None:
    """Only the team's managers and admins settle a request; a refused click is audited."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    for outsider in (NADIA, CAROL):
        refused = services.deny(outsider, asked.request.id)
        assert isinstance(refused, Refused)
        assert "You may not approve or deny R2" in refused.message
        assert f"<@{VICTOR}>" not in refused.message
    assert ["approval:refused", "approval:refused"] == tags(services)[-2:]
    assert "pending" == services.requests(BOB)[0].state


def test_a_refused_click_on_a_settled_request_reveals_nothing_of_it(services: Services) -> None:
    """An outsider's Approve on a request already granted learns only that they may not:
    not its hosts, GPUs, who settled it or why."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2, reason="secret ablation"))
    services.approve(VICTOR, asked.request.id, "fine")
    for outsider in (NADIA, CAROL):
        for act in (services.approve, services.deny):
            refused = act(outsider, asked.request.id)
            assert isinstance(refused, Refused)
            assert "not-allowed" == refused.code
            shown = refused.message
            assert not any(word in shown for word in ("node", "secret", "fine", VICTOR))
        assert isinstance(services.may_settle(outsider, asked.request.id), Refused)


def test_a_second_click_changes_nothing(services: Services) -> None:
    """Approve twice, or deny after approve: one decision, the second answer says so."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    services.approve(VICTOR, asked.request.id)
    before = tags(services)
    again = services.deny(ADA, asked.request.id)
    assert isinstance(again, SettleResult)
    assert again.already_settled
    assert "already settled by <@U0VMGR001> at 2026-03-02 09:00 UTC: it is approved" in (
        again.message
    )
    assert before == tags(services)
    assert 2 == len(services.leases())


def test_a_manager_denies_with_a_reason(services: Services) -> None:
    """Deny records who and why; no lease is created."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    denied = services.deny(VICTOR, asked.request.id, "use the l40s pool")
    assert isinstance(denied, SettleResult)
    assert "denied" == denied.request.state
    assert denied.lease is None
    assert "use the l40s pool" in denied.message
    explanation = services.why(BOB, f"R{asked.request.id}")
    assert not isinstance(explanation, Refused)
    assert "use the l40s pool" in explanation.lines[-1]


def test_beyond_the_borrowing_limit_is_denied_with_the_reason(services: Services) -> None:
    """deny records why, with the numbers the rules saw."""
    result = borrowed(services, ALICE, BorrowAsk("a100", 13))
    assert Outcome.DENY == result.outcome
    assert "13 GPUs is more than one request may take in a100 (8)" == result.because
    assert "denied" == result.request.state


def test_nothing_free_queues_the_request(services: Services) -> None:
    """A borrow inside nominal waits when others borrowed the pool full."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    borrowed(services, CAROL, BorrowAsk("a100", 6))
    asked = borrowed(services, "U0DAVE001", BorrowAsk("a100", 2))
    assert isinstance(services.approve(NADIA, asked.request.id), SettleResult)
    late = borrowed(services, ERIN, BorrowAsk("a100", 1))
    assert Outcome.QUEUE == late.outcome
    assert "queued" == late.request.state
    assert "only 0 of 16 GPUs are free in a100" in late.because


def test_the_protected_pool_asks_an_admin_not_the_manager(services: Services) -> None:
    """ask admins routes to admins alone; the team's manager may not approve."""
    result = borrowed(services, ERIN, BorrowAsk("inference", 2, timedelta(days=7)))
    assert Outcome.ASK == result.outcome
    assert (ADA,) == result.request.approvers
    assert isinstance(services.approve("U0PMGR001", result.request.id), Refused)
    settled = services.approve(ADA, result.request.id)
    assert isinstance(settled, SettleResult)
    assert settled.lease is not None
    assert settled.lease.protected


def test_people_outside_every_team_and_unknown_pools_are_told_how_to_go_on(
    services: Services,
) -> None:
    """Input the rules cannot weigh is refused with what to do, and nothing is recorded."""
    before = tags(services)
    stranger = services.borrow("U0STRANGE", BorrowAsk("a100", 1))
    assert isinstance(stranger, Refused)
    assert "not a member of any team" in stranger.message
    typo = services.borrow(ALICE, BorrowAsk("a10", 1))
    assert isinstance(typo, Refused)
    assert "There is no pool called `a10`. Pools: a100, inference, l40s." == typo.message
    assert before == tags(services)


def test_a_borrow_without_duration_takes_the_pool_default(services: Services) -> None:
    """No duration means the policy's default_duration (4h)."""
    lease = borrowed(services, ALICE, BorrowAsk("a100", 1)).lease
    assert lease is not None
    assert timedelta(hours=4) == lease.expires_at - lease.granted_at


def test_the_holder_extends_within_the_limits(services: Services, clock: Clock) -> None:
    """An extension moves the expiry and counts; the third is denied with the reason."""
    lease = borrowed(services, ALICE, BorrowAsk("a100", 2, timedelta(hours=6))).lease
    assert lease is not None
    clock.advance(timedelta(hours=5))
    first = services.extend(ALICE, lease.id, timedelta(hours=2))
    assert isinstance(first, ExtendResult)
    assert Outcome.APPROVE == first.outcome
    assert lease.expires_at + timedelta(hours=2) == first.lease.expires_at
    services.extend(ALICE, lease.id, timedelta(hours=2))
    third = services.extend(ALICE, lease.id, timedelta(hours=2))
    assert isinstance(third, ExtendResult)
    assert Outcome.DENY == third.outcome
    assert "already extended 2 times" in third.because
    assert 2 == third.lease.extensions


def test_only_the_holder_or_an_admin_extends_or_releases(services: Services) -> None:
    """Someone else's lease is refused, an admin's hand is not."""
    lease = borrowed(services, ALICE, BorrowAsk("a100", 2)).lease
    assert lease is not None
    assert isinstance(services.extend(BOB, lease.id, timedelta(hours=1)), Refused)
    assert isinstance(services.release(BOB, lease.id), Refused)
    released = services.release(ADA, lease.id)
    assert isinstance(released, ReleaseResult)
    assert "released" == released.released[0].state


def test_release_frees_the_gpus_for_the_next_borrow(services: Services) -> None:
    """Released GPUs go back to the pool at once."""
    first = borrowed(services, ALICE, BorrowAsk("l40s", 3))
    assert first.lease is not None
    services.release(ALICE, first.lease.id)
    again = borrowed(services, BOB, BorrowAsk("l40s", 3))
    assert again.lease is not None
    assert first.lease.gpus == again.lease.gpus
    assert isinstance(services.release(ALICE, first.lease.id), Refused)  # already released


def test_release_all_ends_every_lease_and_open_request(services: Services) -> None:
    """`release all` gives back every lease and withdraws what still waits."""
    borrowed(services, ALICE, BorrowAsk("a100", 2))
    borrowed(services, ALICE, BorrowAsk("l40s", 1))
    asked = borrowed(services, ALICE, BorrowAsk("a100", 8))
    assert Outcome.ASK == asked.outcome
    result = services.release(ALICE)
    assert isinstance(result, ReleaseResult)
    assert 2 == len(result.released)
    assert [asked.request.id] == [r.id for r in result.cancelled]
    assert [] == services.leases(ALICE)
    assert isinstance(services.release(ALICE), Refused)


def test_why_explains_a_grant_with_the_rule_and_the_facts(services: Services) -> None:
    """The stored explanation names the deciding rule, the because text and the facts seen."""
    result = borrowed(services, ALICE, BorrowAsk("a100", 2, priority=Priority.NORMAL))
    assert result.lease is not None
    explanation = services.why(ALICE, f"L{result.lease.id}")
    assert not isinstance(explanation, Refused)
    text = "\n".join(explanation.lines)
    assert "`borrow:approved`" in text
    assert "rule `within-nominal`" in text
    assert "within team vision's nominal quota (2 of 8 in a100)" in text
    assert "request.duration=4h" in text
    assert "`lease:granted`" in text


def test_why_is_for_the_person_their_managers_and_admins(services: Services) -> None:
    """Others are refused; ids are checked and explained."""
    result = borrowed(services, ALICE, BorrowAsk("a100", 2))
    ref = f"R{result.request.id}"
    assert isinstance(services.why(VICTOR, ref), type(services.why(ALICE, ref)))
    assert not isinstance(services.why(ADA, ref), Refused)
    assert isinstance(services.why(CAROL, ref), Refused)
    ambiguous = services.why(ALICE, "12")
    assert isinstance(ambiguous, Refused)
    assert "R12 (request) or L12 (lease)" in ambiguous.message
    assert isinstance(services.why(ALICE, "R999"), Refused)


def test_every_state_change_is_audited_and_the_chain_verifies(services: Services) -> None:
    """A whole story leaves an unbroken hash chain."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    services.approve(VICTOR, asked.request.id)
    services.release(BOB)
    with services.db.read() as session:
        report = audit.verify(session)
    assert report.ok, report.problem
    assert report.checked == len(tags(services)) >= 7


def test_a_cancelled_request_cannot_be_approved(services: Services) -> None:
    """The requester withdraws; a later click says it is settled."""
    borrowed(services, ALICE, BorrowAsk("a100", 8))
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    assert not isinstance(services.cancel(BOB, asked.request.id), Refused)
    late = services.approve(VICTOR, asked.request.id)
    assert isinstance(late, SettleResult)
    assert late.already_settled
    assert late.lease is None


def owed(services: Services) -> list[tuple[str, str, str]]:
    from storage.tables import OutboxRow

    with services.db.read() as session:
        rows = session.exec(select(OutboxRow).order_by(col(OutboxRow.id))).all()
    # Messages only: Home tabs are owed for every change and tested in test_homes.
    return [(r.kind, r.subject, r.recipient) for r in rows if r.kind != "home"]


def test_decisions_owe_their_messages_in_the_same_transaction(services: Services) -> None:
    """ask owes cards to the approval channel; approval owes the card update and the grant DM."""
    first = borrowed(services, ALICE, BorrowAsk("a100", 8))
    assert first.lease is not None
    asked = borrowed(services, BOB, BorrowAsk("a100", 2))
    services.approve(VICTOR, asked.request.id)
    granted = services.leases(BOB)[0]
    assert [
        ("lease_granted", f"lease:{first.lease.id}", ALICE),
        ("approval_card", f"request:{asked.request.id}", "C0VAPPROV"),
        ("lease_granted", f"lease:{granted.id}", BOB),
        ("card_settled", f"request:{asked.request.id}", "cards"),
    ] == owed(services)


def test_a_dm_route_owes_one_card_per_approver(services: Services) -> None:
    """The platform team routes approvals to its managers' DMs; admins get one too."""
    borrowed(services, ERIN, BorrowAsk("a100", 2))
    asked = borrowed(services, ERIN, BorrowAsk("a100", 2))
    assert Outcome.ASK == asked.outcome
    cards = [o for o in owed(services) if o[0] == "approval_card"]
    assert [("U0PMGR001",), (ADA,)] == [(c[2],) for c in cards]


def test_a_refused_request_owes_nothing(services: Services) -> None:
    """Nothing is owed when nothing was decided."""
    services.borrow("U0STRANGE", BorrowAsk("a100", 1))
    borrowed(services, ALICE, BorrowAsk("a100", 13))
    assert [] == owed(services)
