"""Shrinking a lease on a real database (SQLite and PostgreSQL): the GPU set and the count
change together, audited as lease:shrunk, the queue is served at once; the errors say how to go
on; and the sweep's `shrink idle` waits for a delivered warning and the grace, never paused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlmodel import col, select

from bot.services import BorrowAsk, Refused, Services, device_records
from bot.services.results import GpuSlot, LeaseView, ShrinkResult
from bot.telemetry.window import TelemetryWindow
from storage import outbox
from storage.db import Database
from storage.outbox import OutboxKind
from storage.tables import AuditRow, OutboxRow
from tests.builders import a_sample, default_sources
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, ERIN, Clock, approved, borrowed

# Asks to shrink without waiting for the warning: the invariants, not the rule, make it wait.
SHRINK_RULE = """
  - id: shrink-partly-idle
    on: lease
    when: lease.partly_idle and not lease.kept and lease.idle_gpus_for >= 2h
    then: shrink idle
    because: "{lease.idle_gpus} GPUs of lease {lease.id} are idle"
"""


def four_gpus(services: Services, user: str = ALICE) -> LeaseView:
    result = borrowed(services, user, BorrowAsk("a100", 4, timedelta(hours=8), reason="sweeps"))
    assert result.lease is not None
    return result.lease


def shrunk_rows(services: Services) -> list[AuditRow]:
    with services.db.read() as session:
        return list(session.exec(select(AuditRow).where(col(AuditRow.tag) == "lease:shrunk")))


def names(slots: tuple[GpuSlot, ...]) -> list[str]:
    return sorted(f"{s.node}:{s.index}" for s in slots)


def test_named_gpus_go_back_and_the_lease_runs_on_with_the_rest(services: Services) -> None:
    """The set and the count change together, and the audit row names what went back."""
    lease = four_gpus(services)
    back = lease.gpus[2:]
    result = services.shrink(ALICE, lease.id, gpus=tuple((s.node, s.index) for s in back))
    assert isinstance(result, ShrinkResult)
    now = services.lease(lease.id)
    assert now is not None
    assert (lease.gpus[:2], "active") == (now.gpus, now.state)
    assert names(back) == names(result.given_back)
    (row,) = shrunk_rows(services)
    assert (ALICE, names(back), 2) == (row.actor, row.detail["gave_back"], row.detail["kept"])
    # the two GPUs are free again: another lease may take them
    again = borrowed(services, BOB, BorrowAsk("a100", 2, timedelta(hours=1)))
    assert again.lease is not None


def test_keep_one_gives_back_the_rest_and_keeps_the_lowest(services: Services) -> None:
    """Without telemetry to tell idle from busy, the lowest-numbered GPU stays."""
    lease = four_gpus(services)
    result = services.shrink(ALICE, lease.id, keep=1)
    assert isinstance(result, ShrinkResult)
    assert (lease.gpus[0],) == result.lease.gpus
    assert 3 == len(result.given_back)


@pytest.mark.parametrize(
    ("case", "gpus", "keep", "says"),
    [
        ("unknown GPU", (("no-such-node", 0),), None, "does not hold no-such-node:0"),
        ("every GPU", "all", None, "`/gpu release L1` gives the whole lease back"),
        ("keep as many as it has", (), 4, "holds 4 GPUs, so keeping 4 gives nothing back"),
        ("keep more", (), 9, "so keeping 9 gives nothing back"),
        ("keep none", (), 0, "Keeping no GPUs is a release: `/gpu release L1`"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_shrink_that_cannot_be_done_changes_nothing_and_says_why(
    services: Services, case: str, gpus: object, keep: int | None, says: str
) -> None:
    """Friendly refusals; the lease keeps every GPU and nothing is audited."""
    lease = four_gpus(services)
    named = tuple((s.node, s.index) for s in lease.gpus) if gpus == "all" else gpus
    assert isinstance(named, tuple)
    result = services.shrink(ALICE, lease.id, gpus=named, keep=keep)
    assert isinstance(result, Refused), case
    assert says in result.message
    assert 4 == len(services.lease(lease.id).gpus)  # type: ignore[union-attr]
    assert [] == shrunk_rows(services)


def test_a_gpu_of_another_lease_is_not_this_leases_to_give(services: Services) -> None:
    """Naming a GPU someone else holds is refused, and that lease keeps it."""
    mine, theirs = four_gpus(services), four_gpus(services, BOB)
    other = theirs.gpus[0]
    result = services.shrink(ALICE, mine.id, gpus=((other.node, other.index),))
    assert isinstance(result, Refused)
    assert f"does not hold {other.node}:{other.index}" in result.message
    assert 4 == len(services.lease(theirs.id).gpus)  # type: ignore[union-attr]


def test_only_the_holder_or_an_admin_shrinks_and_the_holder_hears_of_it(
    services: Services,
) -> None:
    """Bob may not; Ada may, and Alice is told what went back."""
    lease = four_gpus(services)
    refused = services.shrink(BOB, lease.id, keep=1)
    assert isinstance(refused, Refused)
    assert "only they or an admin may change it" in refused.message
    assert isinstance(services.shrink(ADA, lease.id, keep=2), ShrinkResult)
    with services.db.read() as session:
        told = session.exec(
            select(OutboxRow).where(
                OutboxRow.recipient == ALICE, OutboxRow.kind == OutboxKind.NOTICE
            )
        ).one()
    assert "gave back" in str(told.data["text"])
    assert "by an admin" in str(told.data["text"])


def test_a_shrink_serves_the_queue_at_once(services: Services) -> None:
    """A full pool and a request waiting for 2 GPUs: keeping 1 of 4 starts it."""
    lease = four_gpus(services)
    for user, gpus in ((BOB, 4), (CAROL, 6), (ERIN, 2)):
        ask = BorrowAsk("a100", gpus, timedelta(hours=8), reason="runs")
        assert borrowed(services, user, ask).lease is not None
    waiting = borrowed(services, BOB, BorrowAsk("a100", 2, timedelta(hours=2)))
    assert "queued" == approved(services, ADA, waiting).request.state
    result = services.shrink(ALICE, lease.id, keep=1)
    assert isinstance(result, ShrinkResult)
    started = services.request(waiting.request.id)
    assert started is not None
    assert ("approved", [BOB]) == (started.state, [lease.holder for lease in result.started])


def test_an_ended_lease_and_the_history_show_only_what_it_held_to_the_end(
    services: Services, clock: Clock
) -> None:
    """Keep 1 of 4, the queue takes two of the three, then the lease ends: it shows the one
    GPU it held at its end, and the history shows it on the others only until they went back,
    never overlapping the lease that took them."""
    lease = four_gpus(services)
    for user, gpus in ((BOB, 4), (CAROL, 6), (ERIN, 2)):
        ask = BorrowAsk("a100", gpus, timedelta(hours=8), reason="runs")
        assert borrowed(services, user, ask).lease is not None
    waiting = borrowed(services, BOB, BorrowAsk("a100", 2, timedelta(hours=2)))
    approved(services, ADA, waiting)
    clock.advance(timedelta(minutes=30))
    shrunk_at = clock.now
    result = services.shrink(ALICE, lease.id, keep=1)
    assert isinstance(result, ShrinkResult)
    (taker,) = result.started
    clock.advance(timedelta(hours=1))
    assert not isinstance(services.release(ALICE, lease.id), Refused)
    ended = services.lease(lease.id)
    assert ended is not None
    assert ("released", (lease.gpus[0],)) == (ended.state, ended.gpus)
    with services.db.read() as session:
        held = [i for i in device_records.intervals(session) if i.state == "leased"]
    spans = {(i.lease, i.node, i.gpu): (i.end, i.detail.get("ended")) for i in held}
    first = lease.gpus[0]
    assert (clock.now, "released") == spans[(lease.code, first.node, first.index)]
    for slot in lease.gpus[1:]:
        assert (shrunk_at, "given back") == spans[(lease.code, slot.node, slot.index)]
    for slot in taker.gpus:
        start = next(
            i.start for i in held if (i.lease, i.node, i.gpu) == (taker.code, slot.node, slot.index)
        )
        assert shrunk_at <= start


# ---- the sweep's `shrink idle` ---------------------------------------------------------


@pytest.fixture
def shrinking(database: Database, clock: Clock) -> Iterator[Services]:
    """The shipped rules plus a rule that asks to give back idle GPUs at once."""
    sources = default_sources()
    sources["sweep.yaml"] += SHRINK_RULE
    svc = Services.open(database, sources, clock=clock)
    yield svc
    svc.close()


def run(window: TelemetryWindow, clock: Clock, lease: LeaseView, minutes: int) -> None:
    """Samples every 30 s: the lease's first GPU works, the others do nothing."""
    first, *rest = lease.gpus
    for _ in range(minutes * 2):
        clock.advance(timedelta(seconds=30))
        samples = [a_sample(first.node, first.index, 85.0, clock.now)]
        samples += [a_sample(s.node, s.index, 0.0, clock.now) for s in rest]
        window.observe(samples, now=clock.now)


def delivered(services: Services, clock: Clock) -> None:
    """Every message owed so far reached Slack."""
    with services.db.write() as session:
        for row in session.exec(select(OutboxRow)).all():
            if row.delivered_at is None:
                outbox.delivered(session, row.id or 0, at=clock.now, channel="D0ALICE", ts="1.0")


def test_shrink_idle_waits_for_the_delivered_warning_and_the_grace(
    shrinking: Services, clock: Clock
) -> None:
    """Warned at the threshold, nothing taken before delivery and grace, then only the idle
    GPUs go back, audited with the rule that asked."""
    services, window = shrinking, TelemetryWindow(timedelta(minutes=3))
    lease = four_gpus(services)
    run(window, clock, lease, 91)
    report = services.sweep(window)
    assert [f"{lease.code} partly_idle"] == report.warned
    run(window, clock, lease, 40)
    report = services.sweep(window)  # not delivered yet: held back
    assert ([], [f"{lease.code} idle: no delivered partly_idle warning yet"]) == (
        report.shrunk,
        report.held_back,
    )
    delivered(services, clock)
    run(window, clock, lease, 29)
    assert [] == services.sweep(window).shrunk  # within the grace
    run(window, clock, lease, 1)
    assert [f"{lease.code} gave back 3"] == services.sweep(window).shrunk
    assert (lease.gpus[0],) == services.lease(lease.id).gpus  # type: ignore[union-attr]
    (row,) = shrunk_rows(services)
    assert ("gpubot", "shrink-partly-idle") == (row.actor, row.deciding_rule)
    assert [] == services.sweep(window).shrunk  # a second pass changes nothing


def test_shrink_idle_only_records_what_it_would_have_done_while_paused(
    shrinking: Services, clock: Clock
) -> None:
    """The kill switch: a would-have, every GPU stays."""
    services, window = shrinking, TelemetryWindow(timedelta(minutes=3))
    lease = four_gpus(services)
    run(window, clock, lease, 91)
    services.sweep(window)
    delivered(services, clock)
    assert isinstance(services.pause(ADA), str)
    run(window, clock, lease, 31)
    report = services.sweep(window)
    assert ([], [f"{lease.code} shrink idle (paused)"]) == (report.shrunk, report.would_have)
    assert 4 == len(services.lease(lease.id).gpus)  # type: ignore[union-attr]
    assert [] == shrunk_rows(services)


def test_shrink_idle_gives_back_only_the_gpus_the_warning_named(
    shrinking: Services, clock: Clock
) -> None:
    """Warned first: a GPU that went idle after the warning stays until a warning names it."""
    services, window = shrinking, TelemetryWindow(timedelta(minutes=3))
    lease = four_gpus(services)
    busy = list(lease.gpus[:2])

    observed(window, clock, lease, busy, 91)
    assert [f"{lease.code} partly_idle"] == services.sweep(window).warned
    delivered(services, clock)
    observed(window, clock, lease, busy, 20)
    busy.remove(lease.gpus[1])  # idle from now on, long enough to count, never warned of
    observed(window, clock, lease, busy, 125)
    assert [f"{lease.code} gave back 2"] == services.sweep(window).shrunk
    assert lease.gpus[:2] == services.lease(lease.id).gpus  # type: ignore[union-attr]
    (row,) = shrunk_rows(services)
    assert names(lease.gpus[2:]) == row.detail["gave_back"]


def test_once_no_gpu_the_warning_named_is_idle_a_new_warning_names_those_idle_now(
    shrinking: Services, clock: Clock
) -> None:
    """The two GPUs named got busy and another went idle: that one is warned of before the
    sweep gives it back, and it alone goes back."""
    services, window = shrinking, TelemetryWindow(timedelta(minutes=3))
    lease = four_gpus(services)
    busy = list(lease.gpus[:2])

    observed(window, clock, lease, busy, 91)
    assert [f"{lease.code} partly_idle"] == services.sweep(window).warned
    delivered(services, clock)
    busy = [lease.gpus[0], *lease.gpus[2:]]  # the named two work again, the second idles
    observed(window, clock, lease, busy, 125)
    report = services.sweep(window)  # held back, and the warning no longer stands
    assert ([], [f"{lease.code} idle: no GPU the warning named is idle"]) == (
        report.shrunk,
        report.held_back,
    )
    assert [f"{lease.code} partly_idle"] == services.sweep(window).warned
    delivered(services, clock)
    observed(window, clock, lease, busy, 31)
    assert [f"{lease.code} gave back 1"] == services.sweep(window).shrunk
    (row,) = shrunk_rows(services)
    assert names(lease.gpus[1:2]) == row.detail["gave_back"]


def observed(
    window: TelemetryWindow, clock: Clock, lease: LeaseView, busy: list[GpuSlot], minutes: int
) -> None:
    """`minutes` of samples every 30 s: the GPUs in `busy` at 85 %, the others idle."""
    for _ in range(minutes * 2):
        clock.advance(timedelta(seconds=30))
        samples = [
            a_sample(s.node, s.index, 85.0 if s in busy else 0.0, clock.now) for s in lease.gpus
        ]
        window.observe(samples, now=clock.now)
