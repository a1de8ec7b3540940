"""The demo clock and the demo's opening leases, derived from the fleet's people at the start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.telemetry.fleet_file import load_fleet
from bot.telemetry.sources import DEFAULT_FLEET
from bot.workspace.clock import DemoClock
from bot.workspace.opening import Holding, holdings
from tests.builders import default_policy

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_the_demo_clock_runs_with_real_time_plus_what_was_fast_forwarded() -> None:
    """Advancing adds to the offset; real time keeps flowing underneath."""
    real = [T0]
    clock = DemoClock(lambda: real[0])
    clock.advance(timedelta(minutes=10))
    real[0] += timedelta(seconds=5)
    assert T0 + timedelta(minutes=10, seconds=5) == clock()
    assert timedelta(minutes=10) == clock.offset
    assert clock().timestamp() == clock.timestamp()


def test_the_demo_clock_never_goes_back() -> None:
    with pytest.raises(ValueError, match="only moves forward"):
        DemoClock().advance(timedelta(seconds=-1))


def test_the_default_fleet_opens_with_a_lease_for_each_persons_running_work() -> None:
    """One holding per person per node for the work running at the start; its length is the
    work's end rounded up to the hour plus one, the pool's default when it never ends."""
    fleet = load_fleet(DEFAULT_FLEET)
    found = {(h.user, h.gpus): h for h in holdings(fleet.nodes, default_policy())}
    a100_01 = "a100-node-01"
    assert (
        Holding("U0ALICE01", "a100", tuple((a100_01, i) for i in range(4)), timedelta(hours=6))
        == found[("U0ALICE01", tuple((a100_01, i) for i in range(4)))]
    )
    bob = found[("U0BOB0001", ((a100_01, 4), (a100_01, 5)))]
    assert timedelta(hours=4) == bob.duration  # a notebook never ends: the default 4h
    dave = found[("U0DAVE001", (("a100-node-02", 2),))]
    assert timedelta(hours=2) == dave.duration  # done after 25 minutes
    serving = found[("U0ERIN001", tuple(("infer-node-01", i) for i in range(4)))]
    assert timedelta(days=30) == serving.duration  # a protected pool's work: its longest


def test_work_that_starts_later_is_left_unleased_as_the_fleets_unreserved_use() -> None:
    """Dave's process on a100-node-02 GPU 6 and Carol's on l40s-node-01 GPU 2 start later."""
    fleet = load_fleet(DEFAULT_FLEET)
    held = {gpu for h in holdings(fleet.nodes, default_policy()) for gpu in h.gpus}
    assert ("a100-node-02", 6) not in held
    assert ("l40s-node-01", 2) not in held
    assert 15 == len(held)
