"""The ledger matches the fleet: placement from what telemetry shows, devices that stop reporting,
strangers on leased GPUs, swapped cards, unknown nodes, and each device's history."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlmodel import select

from bot.services import BorrowAsk, Refused, Services
from bot.services.results import BorrowResult, LeaseView
from bot.telemetry.model import ProcessInfo, Sample
from bot.telemetry.window import TelemetryWindow
from storage.gpus import Place
from storage.tables import AuditRow, GpuRow, OutboxRow
from tests.unit.bot.conftest import ADA, ALICE, BOB, CAROL, ERIN, Clock

DAVE = "U0DAVE001"
POLL = timedelta(seconds=30)
L40S = {"l40s-node-01": 4, "l40s-node-02": 4}


def reading(
    node: str,
    index: int,
    at: datetime,
    *,
    memory: int = 0,
    util: float = 0.0,
    users: tuple[str, ...] = (),
    uuid: str | None = None,
    started: float | None = None,
) -> Sample:
    processes = tuple(
        ProcessInfo(pid=5000 + i, user=u, used_mib=memory, started=started)
        for i, u in enumerate(users)
    )
    return Sample(
        node=node,
        index=index,
        uuid=uuid or f"GPU-{node}-{index}",
        model="NVIDIA L40S",
        memory_total_mib=46068,
        memory_used_mib=memory,
        util_pct=util,
        temperature_c=41.0,
        power_w=80.0,
        health="ok",
        processes=processes,
        taken_at=at,
    )


class Fleet:
    """The l40s pool's eight GPUs as telemetry sees them; `busy` overrides some of them."""

    def __init__(self, services: Services, clock: Clock) -> None:
        self.services, self.clock = services, clock
        self.telemetry = TelemetryWindow(timedelta(minutes=3), expected_interval=POLL)
        self.since = clock()
        self.quiet: set[str] = set()  # nodes that send nothing
        self.special: dict[tuple[str, int], dict[str, object]] = {}

    def poll(self) -> None:
        """One poll, 30 s after the one before."""
        self.clock.advance(POLL)
        now = self.clock()
        samples = []
        for node, count in L40S.items():
            if node in self.quiet:
                continue
            for index in range(count):
                shown = self.special.get((node, index), {})
                samples.append(reading(node, index, now, **shown))  # type: ignore[arg-type]
        self.telemetry.observe(samples, now)
        self.services.observe_fleet(self.telemetry, self.since)

    def run(self, span: timedelta) -> None:
        """Poll every 30 s for `span`."""
        end = self.clock() + span
        while self.clock() < end:
            self.poll()


@pytest.fixture
def fleet(services: Services, clock: Clock) -> Fleet:
    found = Fleet(services, clock)
    found.poll()
    return found


def granted(result: BorrowResult | Refused) -> LeaseView:
    assert isinstance(result, BorrowResult), result
    assert result.lease is not None, result
    return result.lease


def places(services: Services) -> dict[tuple[str, int], Place]:
    return {(g.node, g.index): g.place for g in services.fleet_lines() if g.pool == "l40s"}


def owed(services: Services, kind: str) -> list[OutboxRow]:
    with services.db.read() as session:
        return list(session.exec(select(OutboxRow).where(OutboxRow.kind == kind)).all())


# ---- placement ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shown", "offered"),
    [
        ({}, True),
        ({"users": ("carol",), "memory": 41000, "util": 83.0}, False),  # busy
        ({"memory": 6100}, False),  # memory held, no process listed
        ({"memory": 200}, True),  # within the floor
        ({"users": ("bob",)}, False),  # a process holding no memory yet
    ],
    ids=["empty", "busy", "memory-only", "within-floor", "process-only"],
)
def test_placement_never_offers_a_gpu_that_telemetry_shows_in_use(
    services: Services, fleet: Fleet, shown: dict[str, object], offered: bool
) -> None:
    """Seven GPUs of the l40s pool are empty; the eighth shows `shown`. Three teams take their
    nominal, all eight GPUs: the last grant happens only when the eighth counts as free."""
    fleet.special[("l40s-node-01", 2)] = shown
    fleet.poll()
    status = next(p for p in services.status() if p.name == "l40s")
    assert ((8, 0) if offered else (7, 1)) == (status.free, status.occupied)
    granted(services.borrow(ALICE, BorrowAsk("l40s", 3)))
    granted(services.borrow(CAROL, BorrowAsk("l40s", 3)))
    result = services.borrow(ERIN, BorrowAsk("l40s", 2))
    assert isinstance(result, BorrowResult)
    assert offered == (result.lease is not None)


def test_a_busy_gpu_is_passed_over_and_counted_as_in_use_without_a_lease(
    services: Services, fleet: Fleet
) -> None:
    """Carol's unreserved job keeps l40s-node-01:2 out of every grant and every free count."""
    fleet.special[("l40s-node-01", 2)] = {"users": ("carol",), "memory": 41000, "util": 83.0}
    fleet.poll()
    status = next(p for p in services.status() if p.name == "l40s")
    assert (7, 1, 0) == (status.free, status.occupied, status.unhealthy)
    assert ["l40s-node-01:2 by carol"] == services.unreserved()
    leases = [granted(services.borrow(who, BorrowAsk("l40s", 2))) for who in (ALICE, DAVE, ERIN)]
    leases.append(granted(services.borrow(BOB, BorrowAsk("l40s", 1))))
    taken = {(s.node, s.index) for lease in leases for s in lease.gpus}
    assert ("l40s-node-01", 2) not in taken
    assert 7 == len(taken)
    assert Place.OCCUPIED == places(services)[("l40s-node-01", 2)]
    # Only Carol, whose work it is, is granted the last GPU: her lease covers her job.
    waits = services.borrow(ERIN, BorrowAsk("l40s", 1))
    assert isinstance(waits, BorrowResult)
    assert waits.lease is None
    hers = granted(services.borrow(CAROL, BorrowAsk("l40s", 1)))
    assert [("l40s-node-01", 2)] == [(s.node, s.index) for s in hers.gpus]


def test_gpus_without_fresh_telemetry_are_offered_last_and_the_grant_says_so(
    services: Services, fleet: Fleet, clock: Clock
) -> None:
    """l40s-node-02 has not reported yet (a restart): its GPUs go only when the rest are gone,
    and the grant DM names them."""
    fleet.quiet.add("l40s-node-02")
    fleet.telemetry = TelemetryWindow(timedelta(minutes=3), expected_interval=POLL)
    fleet.since = clock()
    with services.db.write() as session:
        for gpu in session.exec(select(GpuRow)).all():
            gpu.observed = "unknown"
            session.add(gpu)
    fleet.poll()
    first = granted(services.borrow(ALICE, BorrowAsk("l40s", 3)))
    assert {"l40s-node-01"} == set(first.by_node)
    second = granted(services.borrow(CAROL, BorrowAsk("l40s", 1)))
    assert [("l40s-node-01", 3)] == [(s.node, s.index) for s in second.gpus]
    third = granted(services.borrow(ERIN, BorrowAsk("l40s", 2)))
    assert {"l40s-node-02"} == set(third.by_node)
    notes = [r.data.get("unknown") for r in owed(services, "lease_granted")]
    assert [None, None, ["l40s-node-02:0", "l40s-node-02:1"]] == notes


def test_ones_own_unreserved_process_can_be_borrowed_in_one_click(
    services: Services, fleet: Fleet
) -> None:
    """Bob's notebook occupies a GPU: nobody else gets it, but Bob may lease exactly it."""
    fleet.special[("l40s-node-02", 1)] = {"users": ("bob",), "memory": 6100}
    fleet.poll()
    mine = services.borrow(BOB, BorrowAsk("l40s", 1, prefer=(("l40s-node-02", 1),)))
    lease = granted(mine)
    assert [("l40s-node-02", 1)] == [(s.node, s.index) for s in lease.gpus]
    again = services.borrow(BOB, BorrowAsk("l40s", 1, prefer=(("l40s-node-02", 1),)))
    assert isinstance(again, Refused)  # the button named that GPU: nothing else instead
    assert f"l40s-node-02 GPU 1 is yours already, in {lease.code}" in again.message
    assert [lease.code] == [v.code for v in services.leases(BOB)]
    fleet.special[("l40s-node-02", 2)] = {"users": ("bob",), "memory": 6100}
    fleet.poll()
    theirs = services.borrow(CAROL, BorrowAsk("l40s", 1, prefer=(("l40s-node-02", 2),)))
    assert isinstance(theirs, Refused)
    assert "someone else's work runs on l40s-node-02 GPU 2 now" in theirs.message


# ---- devices that stop reporting -------------------------------------------------------------


def test_a_node_that_stops_reporting_leaves_service_and_admins_hear_once(
    services: Services, fleet: Fleet
) -> None:
    fleet.quiet.add("l40s-node-02")
    fleet.run(timedelta(seconds=60))
    assert Place.FREE == places(services)[("l40s-node-02", 0)]  # not yet: within three polls
    fleet.run(timedelta(minutes=5))
    assert {Place.SILENT} == {p for (n, _), p in places(services).items() if n == "l40s-node-02"}
    status = next(p for p in services.status() if p.name == "l40s")
    assert (4, 4, 4) == (status.free, status.unhealthy, status.silent)
    lease = granted(services.borrow(ALICE, BorrowAsk("l40s", 3)))
    assert {"l40s-node-01"} == set(lease.by_node)
    told = [line["text"] for r in owed(services, "admin_digest") for line in r.data["lines"]]
    assert 1 == sum("l40s-node-02 has sent no telemetry" in t for t in told)
    fleet.quiet.clear()
    fleet.poll()
    assert Place.FREE == places(services)[("l40s-node-02", 0)]
    told = [line["text"] for r in owed(services, "admin_digest") for line in r.data["lines"]]
    assert 1 == sum("l40s-node-02 reports again" in t for t in told)
    kinds = [(e.device, e.kind) for e in services.node_history("l40s-node-02")]
    assert [("l40s-node-02", "not-reporting"), ("l40s-node-02", "back")] == kinds[-2:]
    nodes = services.nodes(ADA)
    assert not isinstance(nodes, Refused)
    assert {"reporting"} == {n.reporting for n in nodes if n.pool == "l40s"}


def test_a_configured_node_that_never_reports_is_not_counted_as_free(
    services: Services, fleet: Fleet
) -> None:
    """A node named in pools.yaml that nothing ever reports for (a misspelling) is out of
    service after three polls, never granted."""
    fleet.run(timedelta(minutes=3))
    status = next(p for p in services.status() if p.name == "a100")
    assert (0, 16) == (status.free, status.silent)
    refused = services.borrow(ALICE, BorrowAsk("a100", 1))
    assert isinstance(refused, BorrowResult)
    assert refused.lease is None


def test_without_any_telemetry_nothing_is_ever_not_reporting(
    services: Services, clock: Clock
) -> None:
    telemetry = TelemetryWindow(timedelta(minutes=3))
    for _ in range(10):
        clock.advance(timedelta(minutes=1))
        services.observe_fleet(telemetry, None)
    status = next(p for p in services.status() if p.name == "a100")
    assert (16, 0) == (status.free, status.silent)
    assert granted(services.borrow(ALICE, BorrowAsk("a100", 1)))


# ---- strangers, swaps and unknown nodes ----------------------------------------------------


def test_a_process_of_someone_else_on_a_leased_gpu_is_told_once(
    services: Services, fleet: Fleet
) -> None:
    lease = granted(services.borrow(ALICE, BorrowAsk("l40s", 1)))
    slot = (lease.gpus[0].node, lease.gpus[0].index)
    fleet.special[slot] = {"users": ("alice",), "memory": 9000, "util": 90.0}
    fleet.poll()
    assert [] == services.intrusions()
    fleet.special[slot] = {"users": ("alice", "dave"), "memory": 9000, "util": 90.0}
    fleet.run(timedelta(minutes=2))
    assert [f"{lease.code} {slot[0]}:{slot[1]} by dave"] == services.intrusions()
    notes = {(r.recipient, r.data["text"].split(":")[0]) for r in owed(services, "notice")}
    where = f"{slot[0]} GPU {slot[1]}"
    assert {
        (ALICE, f"Someone else runs on {where} of your lease {lease.code}"),
        (DAVE, f"Your process on {where} runs on GPUs leased to someone else ({lease.code})"),
    } == notes
    with services.db.read() as session:
        tags = session.exec(select(AuditRow.tag).where(AuditRow.subject == f"lease:{lease.id}"))
        assert 1 == list(tags).count("lease:intruded")
    fleet.special[slot] = {"users": ("alice",), "memory": 9000, "util": 90.0}
    fleet.poll()
    assert [] == services.intrusions()


def test_a_swapped_card_and_an_unknown_node_are_flagged_to_admins(
    services: Services, fleet: Fleet, clock: Clock
) -> None:
    fleet.special[("l40s-node-01", 3)] = {"uuid": "GPU-new-card"}
    fleet.poll()
    stray = reading("l40s-node-9", 0, clock())
    fleet.telemetry.observe([stray], clock())
    fleet.poll()
    fleet.poll()
    told = [line["text"] for r in owed(services, "admin_digest") for line in r.data["lines"]]
    assert 1 == sum("l40s-node-01 GPU 3 has a new UUID (GPU-new-card" in t for t in told)
    assert 1 == sum("l40s-node-9 sends telemetry for 1 GPU but is in no pool" in t for t in told)
    assert 1 == sum("Is it `l40s-node-02` in pools.yaml, misspelt?" in t for t in told)
    assert {"l40s-node-9": 1} == services.strays()
    refused = services.nodes(ADA, "l40s-node-9")
    assert isinstance(refused, Refused)
    assert "reports 1 GPU but is in no pool of pools.yaml" in refused.message
    kinds = {(e.device, e.kind) for e in services.node_history()}
    assert {("l40s-node-01:3", "swapped"), ("l40s-node-9", "unknown-node")} <= kinds


def test_drains_and_profiles_are_part_of_a_nodes_history(services: Services, fleet: Fleet) -> None:
    assert isinstance(services.drain(ADA, "l40s-node-01", "fan replacement"), str)
    assert isinstance(services.undrain(ADA, "l40s-node-01"), str)
    events = services.node_history("l40s-node-01")
    assert [("drained", ADA, {"reason": "fan replacement"}), ("undrained", ADA, {})] == [
        (e.kind, e.actor, dict(e.detail)) for e in events if e.kind.endswith("drained")
    ]
    nodes = services.nodes(ADA, "l40s-node-01")
    assert not isinstance(nodes, Refused)
    gpu = nodes[0].gpus[0]
    assert ("GPU-l40s-node-01-0", 46068, 41.0, 80.0) == (
        gpu.uuid,
        gpu.memory_mib,
        gpu.temperature_c,
        gpu.power_w,
    )
    assert isinstance(services.nodes(ALICE), Refused)
    assert isinstance(services.nodes(ADA, "l40s-node-7"), Refused)


def test_an_observe_pass_with_nothing_new_changes_nothing(services: Services, fleet: Fleet) -> None:
    """The poll runs every 30 s: when telemetry shows what the database holds, nothing changes."""
    fleet.poll()
    report = services.observe_fleet(fleet.telemetry, fleet.since)
    assert ([], [], []) == (report.changed, report.events, report.intruders)


def test_a_restart_keeps_a_silent_gpu_silent_until_it_reports(
    services: Services, fleet: Fleet, clock: Clock
) -> None:
    fleet.quiet.add("l40s-node-02")
    fleet.run(timedelta(minutes=3))
    fleet.telemetry = TelemetryWindow(timedelta(minutes=3), expected_interval=POLL)  # a restart
    fleet.since = clock()
    fleet.poll()
    assert Place.SILENT == places(services)[("l40s-node-02", 0)]
    fleet.quiet.clear()
    fleet.poll()
    assert Place.FREE == places(services)[("l40s-node-02", 0)]


def test_a_new_lease_is_not_idle_for_time_before_it_began(services: Services, fleet: Fleet) -> None:
    """A GPU empty for two hours is granted: its lease is idle for its own age, not the GPU's,
    so the idle warning comes after `warnings.idle_threshold` of the lease, not at once."""
    fleet.run(timedelta(hours=2))
    lease = granted(services.borrow(ALICE, BorrowAsk("l40s", 1, timedelta(hours=6))))
    assert [] == services.sweep(fleet.telemetry).warned
    fleet.run(timedelta(minutes=85))
    assert [] == services.sweep(fleet.telemetry).warned
    fleet.run(timedelta(minutes=6))
    assert [f"{lease.code} idle"] == services.sweep(fleet.telemetry).warned


def test_a_lease_granted_on_work_telemetry_had_not_shown_yet_blames_nobody(
    services: Services, clock: Clock
) -> None:
    """Before the first sample every GPU is unknown: Alice is granted one, and the reply says
    nobody could vouch for it. Erin's job turns out to have run there first: both hear what
    happened, and Erin is not told to stop."""
    result = services.borrow(ALICE, BorrowAsk("l40s", 1))
    lease = granted(result)
    slot = (lease.gpus[0].node, lease.gpus[0].index)
    assert (f"{slot[0]}:{slot[1]}",) == lease.unknown
    fleet = Fleet(services, clock)
    hour_ago = (clock() - timedelta(hours=1)).timestamp()
    fleet.special[slot] = {"users": ("erin",), "memory": 30000, "started": hour_ago}
    fleet.poll()
    notes = {r.recipient: r.data["text"] for r in owed(services, "notice")}
    assert (
        f"{lease.code} was granted {slot[0]} GPU {slot[1]} while pid 5000 of erin" in notes[ALICE]
    )
    assert "already ran there" in notes[ALICE]
    assert "Nothing of yours is stopped" in notes[ERIN]
    assert "Please stop it" not in notes[ERIN]


def test_turning_telemetry_off_returns_silent_gpus_to_unknown_without_a_word(
    services: Services, fleet: Fleet, clock: Clock
) -> None:
    """A node went quiet while telemetry ran; the bot restarts with none configured: nothing is
    expected any more, so its GPUs are unknown (offered last), and nobody hears it is back."""
    fleet.quiet.add("l40s-node-02")
    fleet.run(timedelta(minutes=3))
    assert Place.SILENT == places(services)[("l40s-node-02", 0)]
    clock.advance(timedelta(minutes=1))
    services.observe_fleet(TelemetryWindow(timedelta(minutes=3)), None)
    assert Place.FREE == places(services)[("l40s-node-02", 0)]
    told = [line["text"] for r in owed(services, "admin_digest") for line in r.data["lines"]]
    assert not [t for t in told if "back in service" in t]
