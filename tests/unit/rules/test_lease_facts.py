"""The sweep's lease facts as a table: unknown telemetry is never idle (invariant 3), and a
lease is idle for its own age at most."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rules.lease_facts import LeaseSnapshot, Reading, Warned, covers, lease_facts
from rules.marks import Marks
from tests.builders import Seen, default_policy

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def a_lease(*, age: timedelta = timedelta(hours=3)) -> LeaseSnapshot:
    return LeaseSnapshot(
        id=7,
        holder="U0ALICE01",
        team="vision",
        pool="a100",
        gpus=2,
        priority="normal",
        protected=False,
        granted_at=NOW - age,
        expires_at=NOW + timedelta(hours=3),
        warnings=Marks(),
        snoozed_until=None,
        slots=(("a100-node-01", 0), ("a100-node-01", 1)),
    )


IDLE = Seen()
STALE = Seen(fresh=False)


@pytest.mark.parametrize(
    ("case", "readings", "age", "fresh", "idle", "idle_for"),
    [
        ("both idle for 2h", [IDLE, IDLE], timedelta(hours=3), True, True, 120.0),
        ("one GPU stale", [IDLE, STALE], timedelta(hours=3), False, False, 0.0),
        ("one GPU never read", [IDLE, None], timedelta(hours=3), False, False, 0.0),
        ("no readings at all", [], timedelta(hours=3), False, False, 0.0),
        ("busy on one GPU", [IDLE, Seen(idle_for=timedelta(0))], timedelta(hours=3), True,
         False, 0.0),
        ("idle before the lease began", [IDLE, IDLE], timedelta(minutes=30), True, True, 30.0),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_unknown_telemetry_is_never_idle(
    case: str,
    *,
    readings: list[Reading | None],
    age: timedelta,
    fresh: bool,
    idle: bool,
    idle_for: float,
) -> None:
    """Idle needs fresh readings of every GPU of the lease."""
    facts = lease_facts(default_policy(), a_lease(age=age), readings, Warned(), NOW)
    got = (facts["telemetry.fresh"], facts["lease.idle"], facts["lease.idle_for"])
    assert (fresh, idle, idle_for) == got, case


@pytest.mark.parametrize(
    ("holder", "unix_user", "covered"),
    [
        ("U0ALICE01", "alice", True),  # her own account
        ("U0ALICE01", "U0ALICE01", True),  # named by Slack id
        ("U0ALICE01", None, True),  # unnamed: the benefit of the doubt
        ("U0ALICE01", "", True),
        ("U0ALICE01", "bob", False),
        ("U0ALICE01", "mallory", False),  # an account of nobody known
    ],
)
def test_whose_processes_a_lease_covers(holder: str, unix_user: str | None, covered: bool) -> None:
    """A lease covers its holder's Unix accounts only."""
    assert covered == covers(default_policy(), holder, unix_user)
