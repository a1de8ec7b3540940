"""Random sequences of borrow, settle, extend, release, snooze, telemetry, time, delivery and
sweep, with the safety invariants checked against the database after every step.

One machine per run, on in-memory SQLite and the shipped rules. Telemetry streams one sample a
minute per leased GPU while time moves (so idle stretches can grow long enough to warn and
reclaim); a telemetry step sets a lease's GPUs busy, idle or silent and feeds one sample now.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlmodel import col, select
from sqlmodel.sql.expression import Select

from bot.services import BorrowAsk, Refused, Services
from bot.services.results import BorrowResult, LeaseView, QueueEntry, RequestView
from bot.telemetry.model import Sample
from bot.telemetry.window import TelemetryWindow
from rules.domain import LeaseState, Outcome, Priority, RequestState
from rules.fairshare import Interval, decayed_usage
from storage import audit, outbox
from storage.db import Database
from storage.tables import AuditRow, LeaseGpuRow, LeaseRow, OutboxRow, RequestRow
from tests.builders import a_sample, default_sources
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, ERIN, NADIA, VICTOR, Clock

DAVE, PAT = "U0DAVE001", "U0PMGR001"  # nlp member, platform manager
PEOPLE = (ALICE, BOB, CAROL, DAVE, ERIN, VICTOR, NADIA, PAT, ADA)
POOLS = ("a100", "l40s", "inference")
PROTECTED_POOL = "inference"
# The warning a reclaim stands on, by the reclaim's reason (as in bot.services.sweep).
WARNING_FOR = {
    "expired": "expiry",
    "idle": "idle",
    "unhealthy": "unhealthy",
    "preempted": "preempt",
}
RANK = {"high": 0, "normal": 1, "low": 2}
MINUTE = timedelta(minutes=1)

durations = st.one_of(
    st.sampled_from([30, 45, 60, 90, 120, 240, 24 * 60, 3 * 24 * 60]),
    st.integers(30, 3 * 24 * 60),
).map(lambda m: timedelta(minutes=m))
picks = st.integers(0, 1_000)  # an index into whatever is there now (shrinks towards the first)

# What the preconditions ask, hypothesis asking before each step it draws: whether any lease
# is active (any request pending), without building every lease's (request's) view to count.
ANY_ACTIVE = select(LeaseRow.id).where(LeaseRow.state == LeaseState.ACTIVE).limit(1)
ANY_PENDING = select(RequestRow.id).where(RequestRow.state == RequestState.PENDING).limit(1)


def _sample(node: str, index: int, util: float, at: datetime) -> Sample:
    return a_sample(node, index, util, at)


class Governance(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.db = Database("sqlite://")
        self.db.create_all()
        self.services = Services.open(self.db, default_sources(), clock=self.clock)
        self.policy = self.services.policy
        self.telemetry = TelemetryWindow(self.policy.timing.stale_after, expected_interval=MINUTE)
        # What each GPU reports while time moves: a utilisation, or None for silence.
        self.util: dict[tuple[str, int], float | None] = {}

    def teardown(self) -> None:
        try:
            with self.db.read() as session:
                report = audit.verify(session)
                tags = Counter(session.exec(select(AuditRow.tag)).all())
                ends = Counter(session.exec(select(LeaseRow.end_reason)).all())
            assert report.ok, report
            # How far runs get, in --hypothesis-show-statistics.
            event(f"recalled: {tags['lease:recalled'] > 0}")
            event(f"preempted: {ends['preempted'] > 0}")
            event(f"recall withdrawn: {tags['lease:recall-withdrawn'] > 0}")
        finally:
            self.services.close()
            self.db.dispose()

    # ---- helpers ------------------------------------------------------------------------

    def _active(self) -> list[LeaseView]:
        return self.services.leases()

    def _pending(self) -> list[RequestView]:
        return [r for r in self.services.requests() if r.state == RequestState.PENDING]

    def _exists(self, query: Select[tuple[int | None]]) -> bool:
        with self.db.read() as session:
            return session.exec(query).first() is not None

    def _recalling(self) -> bool:
        with self.db.read() as session:
            active = session.exec(
                select(col(LeaseRow.warnings)).where(LeaseRow.state == LeaseState.ACTIVE)
            ).all()
        return any(marks.recalled for marks in active)

    def _leased(self) -> list[tuple[str, int]]:
        return [(s.node, s.index) for lease in self._active() for s in lease.gpus]

    def _feed(self, gpus: list[tuple[str, int]], at: datetime) -> None:
        """One sample per GPU at `at`, as each is set to report (idle unless told otherwise)."""
        samples = []
        for node, index in gpus:
            util = self.util.get((node, index), 0.0)
            if util is not None:
                samples.append(_sample(node, index, util, at))
        self.telemetry.observe(samples)

    # ---- rules --------------------------------------------------------------------------

    @initialize(
        user=st.sampled_from([ALICE, BOB, CAROL, DAVE]),
        pool=st.just("a100"),  # l40s is left to crowd_l40s's starts
        gpus=st.integers(1, 3),
        minutes=st.integers(30, 360),
    )
    def first_lease(self, user: str, pool: str, gpus: int, minutes: int) -> None:
        """A short lease inside nominal, granted at once, so the sweep has work from the start."""
        self.services.borrow(user, BorrowAsk(pool, gpus, minutes * MINUTE))

    @initialize(start=st.sampled_from(["empty", "crowded", "lent out"]))
    def crowd_l40s(self, start: str) -> None:
        """Sometimes vision and nlp take their l40s nominal first, so later asks queue; and
        sometimes nlp borrows beyond its nominal and, an hour later, vision asks for its own
        nominal, so the borrowed lease is recalled."""
        day = 24 * 60 * MINUTE
        if start == "crowded":
            self.services.borrow(BOB, BorrowAsk("l40s", 3, day))
            self.services.borrow(DAVE, BorrowAsk("l40s", 3, day))
        elif start == "lent out":
            self.services.borrow(CAROL, BorrowAsk("l40s", 3, day))
            self.services.borrow(ERIN, BorrowAsk("l40s", 2, day))
            for _ in range(2):  # nlp borrows 2 more beyond its nominal, a manager agreeing
                asked = self.services.borrow(DAVE, BorrowAsk("l40s", 1, day))
                if not isinstance(asked, Refused) and asked.request.state == "pending":
                    self.services.approve(NADIA, asked.request.id)
            self.advance(61)
            self.services.borrow(ALICE, BorrowAsk("l40s", 3, 4 * 60 * MINUTE))

    @initialize(start=st.sampled_from(["as is", "head waits"]))
    def a100_head_waits(self, start: str) -> None:
        """Sometimes a100 fills and vision's request inside its nominal waits for a loan to
        end, with 2 GPUs free: later short requests may backfill, long ones may not."""
        if start == "as is":
            return
        self.services.borrow(CAROL, BorrowAsk("a100", 6, 180 * MINUTE))
        asked = self.services.borrow(DAVE, BorrowAsk("a100", 4, 120 * MINUTE))
        if not isinstance(asked, Refused) and asked.request.state == "pending":
            self.services.approve(NADIA, asked.request.id)
        self.services.borrow(BOB, BorrowAsk("a100", 4, 480 * MINUTE))
        self.services.borrow(ALICE, BorrowAsk("a100", 4, 240 * MINUTE))

    @rule(
        user=st.sampled_from(PEOPLE),
        pool=st.sampled_from(POOLS),
        gpus=st.one_of(st.integers(1, 4), st.integers(1, 9)),
        duration=durations,
        priority=st.sampled_from(list(Priority)),
    )
    def borrow(
        self, user: str, pool: str, gpus: int, duration: timedelta, priority: Priority
    ) -> None:
        waiting = any(r.pool == pool for r in self.services.queue())
        before = self.services.queue_explained() if waiting else []
        result = self.services.borrow(user, BorrowAsk(pool, gpus, duration, priority))
        if before and isinstance(result, BorrowResult) and result.outcome == Outcome.APPROVE:
            # Granted while others wait (backfill): it comes after every waiting guarantee of
            # its priority or higher, so it may delay none of them.
            after = {e.request.id: e for e in self.services.queue_explained()}
            for entry in before:
                if (
                    entry.request.pool == pool
                    and entry.guaranteed
                    and (RANK[entry.request.priority] <= RANK[priority])
                ):
                    self._not_delayed(entry, after, by=[result.request.id])

    @precondition(lambda self: self._exists(ANY_PENDING))
    @rule(which=picks, approver=picks, allowed=st.integers(0, 3), approve=st.booleans())
    def settle(self, which: int, approver: int, allowed: int, approve: bool) -> None:
        pending = self._pending()
        request = pending[which % len(pending)]
        choices = request.approvers if allowed and request.approvers else PEOPLE
        user = choices[approver % len(choices)]
        if approve:
            self.services.approve(user, request.id)
        else:
            self.services.deny(user, request.id)

    @precondition(lambda self: self._exists(ANY_ACTIVE))
    @rule(
        which=picks,
        hours=st.integers(1, 24),
        by_holder=st.integers(0, 3),
        other=st.sampled_from(PEOPLE),
    )
    def extend(self, which: int, hours: int, by_holder: int, other: str) -> None:
        leases = self._active()
        lease = leases[which % len(leases)]
        self.services.extend(lease.holder if by_holder else other, lease.id, hours * 60 * MINUTE)

    @precondition(lambda self: self._exists(ANY_ACTIVE))
    @rule(which=picks, everything=st.booleans(), by_holder=st.integers(0, 3))
    def release(self, which: int, everything: bool, by_holder: int) -> None:
        leases = self._active()
        lease = leases[which % len(leases)]
        user = lease.holder if by_holder else PEOPLE[which % len(PEOPLE)]
        self.services.release(user, None if everything else lease.id)

    @precondition(lambda self: self._exists(ANY_ACTIVE))
    @rule(which=picks)
    def snooze(self, which: int) -> None:
        leases = self._active()
        lease = leases[which % len(leases)]
        self.services.snooze(lease.holder, lease.id)

    @precondition(lambda self: self._exists(ANY_ACTIVE))
    @rule(which=picks, mode=st.sampled_from(["busy", "idle", "idle", "silent"]))
    def telemetry_for(self, which: int, mode: str) -> None:
        leases = self._active()
        lease = leases[which % len(leases)]
        util = {"busy": 80.0, "idle": 0.0, "silent": None}[mode]
        for slot in lease.gpus:
            self.util[(slot.node, slot.index)] = util
        self._feed(self._leased(), self.clock.now)

    @rule(minutes=st.integers(1, 90))
    def advance(self, minutes: int) -> None:
        gpus = self._leased()  # nothing is granted or ended while time moves
        for _ in range(minutes):
            self.clock.advance(MINUTE)
            self._feed(gpus, self.clock.now)

    @rule()
    def deliver(self) -> None:
        now = self.clock.now
        with self.db.write() as session:
            pending = session.exec(select(OutboxRow).where(OutboxRow.state == outbox.PENDING))
            for row in list(pending.all()):
                assert row.id is not None
                outbox.delivered(session, row.id, at=now, channel="D0TEST", ts="1.0")

    @rule()
    def sweep(self) -> None:
        self.services.sweep(self.telemetry)
        self.services.serve_queue()

    @precondition(lambda self: self._recalling())
    @rule()
    def recall_runs_its_course(self) -> None:
        """A recall under way: warned, delivered, the notice waited out, swept again."""
        self.sweep()
        self.deliver()
        self.advance(31)
        self.sweep()

    # The reclaim path needs sweep, deliver, time, sweep in turn: these twins make those steps
    # more likely among the others (rules are drawn evenly).
    @rule()
    def sweep_again(self) -> None:
        self.sweep()

    @rule()
    def deliver_again(self) -> None:
        self.deliver()

    @rule(minutes=st.integers(1, 90))
    def advance_again(self, minutes: int) -> None:
        self.advance(minutes)

    @precondition(lambda self: bool(self.services.queue()))
    @rule()
    def serve_the_queue(self) -> None:
        """A pass of the queue with requests waiting: whatever it grants further back delays
        no earlier request's expected start in the same pool (backfill)."""
        before = self.services.queue_explained()
        self.services.serve_queue()
        after = {e.request.id: e for e in self.services.queue_explained()}
        started = {e.request.id for e in before if self._state(e.request.id) == "approved"}
        event(f"backfilled: {bool(started)}")
        for i, entry in enumerate(before):
            behind = {e.request.id for e in before[i + 1 :] if e.request.pool == entry.request.pool}
            if behind & started:
                self._not_delayed(entry, after, by=sorted(behind & started))

    def _not_delayed(self, entry: QueueEntry, after: dict[int, QueueEntry], by: list[int]) -> None:
        """A request still waiting starts no later than it was expected to."""
        if entry.expected_start is None or entry.request.id not in after:
            return
        now = after[entry.request.id].expected_start
        assert now is not None, f"R{entry.request.id} lost its expected start to {by}"
        assert now <= entry.expected_start, (
            f"R{entry.request.id} delayed from {entry.expected_start} to {now} by {by}"
        )

    def _state(self, request_id: int) -> str:
        found = self.services.request(request_id)
        return found.state if isinstance(found, RequestView) else ""

    # ---- invariants -----------------------------------------------------------------------

    @invariant()
    def one_lease_per_gpu(self) -> None:
        with self.db.read() as session:
            rows = session.exec(
                select(LeaseGpuRow.gpu_id, LeaseRow.id, LeaseRow.gpus, LeaseRow.state)
                .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
                .where(col(LeaseGpuRow.active).is_(True))
            ).all()
            active = session.exec(
                select(LeaseRow.id, LeaseRow.gpus).where(LeaseRow.state == LeaseState.ACTIVE)
            ).all()
        holders = Counter(gpu_id for gpu_id, _, _, _ in rows)
        assert all(n == 1 for n in holders.values()), f"GPU in two active leases: {rows}"
        assert all(state == LeaseState.ACTIVE for *_, state in rows), (
            f"an ended lease keeps an active GPU: {rows}"
        )
        per_lease = Counter(lease_id for _, lease_id, _, _ in rows)
        for lease_id, gpus in active:
            assert per_lease[lease_id] == gpus, f"L{lease_id}: {per_lease[lease_id]} != {gpus}"

    @invariant()
    def within_quota(self) -> None:
        with self.db.read() as session:
            held = session.exec(
                select(LeaseRow.team, LeaseRow.pool, sa.func.sum(LeaseRow.gpus))
                .where(LeaseRow.state == LeaseState.ACTIVE)
                .group_by(col(LeaseRow.team), col(LeaseRow.pool))
            ).all()
        for team, pool, gpus in held:
            quota = self.policy.pools[pool].quotas[team]
            assert gpus <= quota.nominal + quota.borrowing_limit, (
                f"{team} holds {gpus} in {pool}, limit {quota.nominal + quota.borrowing_limit}"
            )

    @invariant()
    def reclaims_were_warned(self) -> None:
        with self.db.read() as session:
            reclaimed = session.exec(
                select(LeaseRow).where(LeaseRow.state == LeaseState.RECLAIMED)
            ).all()
            for lease in reclaimed:
                assert lease.pool != PROTECTED_POOL, f"inference L{lease.id} was reclaimed"
                assert not lease.protected, f"protected L{lease.id} was reclaimed"
                assert lease.ended_at is not None
                warning = WARNING_FOR[lease.end_reason]
                preempted = lease.end_reason == "preempted"
                grace = self.policy.recall.notice if preempted else self.policy.timing.grace
                assert not preempted or lease.warnings.recalled, f"L{lease.id}: no recall"
                sent = session.exec(
                    select(OutboxRow).where(
                        OutboxRow.kind == "lease_warning",
                        OutboxRow.subject == f"lease:{lease.id}",
                        OutboxRow.state == outbox.DELIVERED,
                    )
                ).all()
                in_time = [
                    w
                    for w in sent
                    if w.data.get("reason") == warning
                    and w.delivered_at is not None
                    and w.delivered_at <= lease.ended_at - grace
                ]
                assert in_time, (
                    f"L{lease.id} reclaimed ({lease.end_reason}) at {lease.ended_at} without a "
                    f"{warning} warning delivered {grace} before: "
                    f"{[(w.id, w.data.get('reason'), w.delivered_at) for w in sent]}"
                )
                # Stricter: the warning the lease stood on was in time (not one withdrawn by a
                # snooze, an extension or busy telemetry). The reclaiming pass itself may owe a
                # nearer-lead expiry warning that replaces it; that one is owed at ended_at.
                standing = lease.warnings.warning(warning)
                assert standing is not None, f"L{lease.id}: no standing {warning} warning"
                replaced_now = standing.get("owed_at") == lease.ended_at.isoformat()
                assert replaced_now or int(standing["outbox"]) in {w.id for w in in_time}, (
                    f"L{lease.id} reclaimed on a withdrawn or late {warning} warning: "
                    f"stood on outbox {standing['outbox']}, in time: {[w.id for w in in_time]}"
                )

    @invariant()
    def recalls_follow_the_rules(self) -> None:
        """Only borrowed, unprotected leases past the minimum runtime are recalled, and
        nobody preempted within the cooldown is recalled again, unless the recall says a
        guarantee waited past recall.max_guarantee_wait."""
        recall = self.policy.recall
        with self.db.read() as session:
            leases = session.exec(select(LeaseRow)).all()
        preempted = [
            (lease.holder, lease.ended_at)
            for lease in leases
            if lease.end_reason == "preempted" and lease.ended_at is not None
        ]
        for lease in leases:
            mark = lease.warnings.recall
            if mark is None:
                continue
            at = datetime.fromisoformat(mark["at"])
            assert lease.pool != PROTECTED_POOL, f"L{lease.id} in a protected pool recalled"
            assert not lease.protected, f"protected L{lease.id} recalled"
            assert at - lease.granted_at >= recall.min_runtime, f"L{lease.id} recalled too young"
            assert mark["team"] != lease.team, f"L{lease.id} recalled for its own team"
            if "cooldown overridden" in str(mark.get("because", "")):
                continue  # a guarantee waited past recall.max_guarantee_wait: it may
            recent = [t for holder, t in preempted if holder == lease.holder and t < at]
            assert all(at - t >= recall.cooldown for t in recent), (
                f"{lease.holder} preempted again within {recall.cooldown}: L{lease.id}"
            )

    @invariant()
    def protected_never_reclaimed(self) -> None:
        with self.db.read() as session:
            found = session.exec(
                select(LeaseRow.id).where(
                    LeaseRow.state == LeaseState.RECLAIMED,
                    sa.or_(col(LeaseRow.protected).is_(True), col(LeaseRow.pool) == PROTECTED_POOL),
                )
            ).all()
        assert not found, f"protected leases reclaimed: {found}"

    @invariant()
    def queue_in_order(self) -> None:
        """The documented order, worked out here from the database: per pool, each team's
        requests in their own queue (inside nominal, then priority, then arrival); the teams'
        heads served inside nominal (held GPUs plus the team's earlier such requests) first,
        then the least fair share used (decayed GPU-hours over weight, each request served
        adding its GPU-hours), then priority, then arrival."""
        with self.db.read() as session:
            queued = session.exec(
                select(RequestRow).where(RequestRow.state == RequestState.QUEUED)
            ).all()
            leases = session.exec(select(LeaseRow)).all()
        expected: list[int | None] = []
        for pool in sorted({r.pool for r in queued}):
            expected += self._pool_order(pool, [r for r in queued if r.pool == pool], leases)
        assert expected == [r.id for r in self.services.queue()], "queue out of order"

    def _pool_order(
        self, pool: str, queued: list[RequestRow], leases: Sequence[LeaseRow]
    ) -> list[int | None]:
        quotas = self.policy.pools[pool].quotas
        used: Counter[str] = Counter()
        for lease in leases:
            if lease.pool == pool and lease.state == LeaseState.ACTIVE:
                used[lease.team] += lease.gpus
        spent = decayed_usage(
            [Interval(x.team, x.gpus, x.granted_at, x.ended_at) for x in leases if x.pool == pool],
            self.clock(),
            self.policy.queue.fair_share_half_life,
        )
        lines: dict[str, list[tuple[RequestRow, bool]]] = {}
        for r in sorted(queued, key=lambda r: (RANK[r.priority], r.created_at, r.id)):
            quota = quotas.get(r.team)
            inside = quota is not None and used[r.team] + r.gpus <= quota.nominal
            used[r.team] += r.gpus if inside else 0
            lines.setdefault(r.team, []).append((r, inside))
        for line in lines.values():
            line.sort(key=lambda item: not item[1])  # inside nominal first, order kept

        def turn(team: str) -> tuple[bool, float, int, datetime, int | None]:
            r, inside = lines[team][0]
            quota = quotas.get(team)
            weight = quota.weight if quota is not None else 1.0
            share = 0.0 if inside else spent.get(team, 0.0) / weight
            return (not inside, share, RANK[r.priority], r.created_at, r.id)

        order: list[int | None] = []
        while lines:
            team = min(lines, key=turn)
            r, _ = lines[team].pop(0)
            order.append(r.id)
            spent[team] = spent.get(team, 0.0) + r.gpus * r.duration_s / 3600
            if not lines[team]:
                del lines[team]
        return order


@pytest.mark.slow
def test_random_sequences_keep_the_invariants() -> None:
    # The same 40 sequences every run, so a red suite always means a change broke something;
    # explore new ones with `--hypothesis-seed=random` (the failure below came from that).
    run_state_machine_as_test(
        Governance,
        settings=settings(
            max_examples=40,
            stateful_step_count=50,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_a_short_backfill_of_the_same_team_does_not_push_its_head_back() -> None:
    """Found by the state machine with a random seed: vision's 4-GPU head waits for 11:00;
    Alice's 1-GPU, 30-minute low-priority borrow starts at once (it ends at 09:30), yet the
    head's expected start moves to 11:30 behind her 3-GPU request while the lease runs."""
    machine = Governance()
    try:
        machine.a100_head_waits(start="head waits")
        machine.first_lease(user=ALICE, pool="a100", gpus=3, minutes=30)
        machine.crowd_l40s(start="empty")
        machine.borrow(user=ALICE, pool="a100", gpus=1, duration=30 * MINUTE, priority=Priority.LOW)
    finally:
        machine.services.close()
        machine.db.dispose()
