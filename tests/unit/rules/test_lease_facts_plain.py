"""The sweep's fast lease facts equal the plain ones: `lease_facts` skips reads for leases
without marks or delivered warnings and writes minutes() out, and gives exactly the facts
(values and types) of the straightforward version kept here, on random leases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rules.facts import minutes
from rules.lease_facts import (
    LeaseSnapshot,
    Reading,
    Warned,
    covers,
    expiry_stage,
    gpu_idleness,
    lease_facts,
)
from rules.marks import Marks
from rules.policy import Policy
from tests.builders import Seen, default_policy

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
POLICY = default_policy()
NODES = ("a100-node-01", "a100-node-02")


@dataclass(frozen=True)
class Process:
    user: str | None


def plain_lease_facts(
    policy: Policy,
    lease: LeaseSnapshot,
    readings: Sequence[Reading | None],
    warned: Warned,
    now: datetime,
) -> dict[str, Any]:
    """The lease facts as first written: one reading at a time, every value from its rule."""
    left = lease.expires_at - now
    stage = expiry_stage(policy, lease, now)
    lead = lease.warnings.expiry_lead()
    age = max(now - lease.granted_at, timedelta(0))
    fresh = bool(readings) and all(r is not None and r.fresh for r in readings)
    idles = [r.idle_for for r in readings if r is not None]
    least = min(idles) if idles else None
    idle_for = min(least, age) if fresh and least is not None else timedelta(0)
    judged = gpu_idleness(policy, lease, readings, now)
    intruded = any(
        not covers(policy, lease.holder, getattr(p, "user", None))
        for r in readings
        if r is not None and r.fresh
        for p in r.processes
    )
    at = warned.at
    pool = policy.pools.get(lease.pool)

    def since(reason: str) -> float:
        when = at(reason)
        return minutes(now - when) if when else 0.0

    return {
        "lease.idle_gpus": len(judged.idle),
        "lease.busy_gpus": len(judged.busy),
        "lease.partly_idle": judged.partly_idle,
        "lease.idle_gpus_for": minutes(judged.idle_for) if judged.idle else 0.0,
        "lease.warned.partly_idle": at("partly_idle") is not None,
        "lease.since_warned.partly_idle": since("partly_idle"),
        "lease.kept": lease.warnings.kept,
        "lease.id": lease.id,
        "lease.pool": lease.pool,
        "lease.team": lease.team,
        "lease.gpus": lease.gpus,
        "lease.priority": lease.priority,
        "lease.protected": lease.protected or pool is None or pool.protected,
        "lease.age": minutes(age),
        "lease.time_left": minutes(left) if left > timedelta(0) else 0.0,
        "lease.overdue": minutes(-left) if left < timedelta(0) else 0.0,
        "lease.expired": left <= timedelta(0),
        "lease.expiry_warning_due": stage is not None and (lead is None or stage < lead),
        "lease.warned.expiry": at("expiry") is not None,
        "lease.warned.idle": at("idle") is not None,
        "lease.since_warned.expiry": since("expiry"),
        "lease.since_warned.idle": since("idle"),
        "lease.idle": fresh and idle_for > timedelta(0),
        "lease.idle_for": minutes(idle_for),
        "lease.snoozed": lease.snoozed_until is not None and lease.snoozed_until > now,
        "lease.unhealthy": any(r is not None and not r.healthy for r in readings),
        "lease.recalled": lease.warnings.recalled,
        "lease.intruded": intruded,
        "lease.warned.preempt": at("preempt") is not None,
        "lease.since_warned.preempt": since("preempt"),
        "telemetry.fresh": fresh,
        "limits.idle_threshold": minutes(policy.timing.idle_threshold),
        "limits.grace": minutes(policy.timing.grace),
        "limits.preempt_notice": minutes(policy.recall.notice),
    }


minutes_span = st.integers(-3 * 24 * 60, 3 * 24 * 60).map(lambda m: timedelta(minutes=m))
seconds_span = st.integers(0, 10 * 3600).map(lambda s: timedelta(seconds=s))
users = st.sampled_from([None, "", "alice", "bob", "zed", "U0ALICE01"])
readings = st.one_of(
    st.none(),
    st.builds(
        Seen,
        fresh=st.booleans(),
        healthy=st.booleans(),
        processes=st.lists(st.builds(Process, users), max_size=2).map(tuple),
        idle_for=seconds_span,
    ),
)
when = st.one_of(st.none(), minutes_span.map(lambda d: NOW - abs(d)))
marks = st.fixed_dictionaries(
    {},
    optional={
        "expiry": st.builds(lambda m: {"outbox": 1, "lead_min": m}, st.sampled_from([0, 10, 60])),
        "recall": st.just({"at": NOW.isoformat(), "request": 3}),
        "kept": st.just({"at": NOW.isoformat()}),
        "idle": st.just({"outbox": 2}),
    },
).map(Marks)


@st.composite
def leases(draw: st.DrawFn) -> tuple[LeaseSnapshot, list[Reading | None]]:
    slots = tuple(
        (node, index)
        for node, index in draw(
            st.lists(st.tuples(st.sampled_from(NODES), st.integers(0, 7)), max_size=4, unique=True)
        )
    )
    lease = LeaseSnapshot(
        id=draw(st.integers(1, 10**6)),
        holder=draw(st.sampled_from(["U0ALICE01", "U0BOB0001"])),
        team="vision",
        pool=draw(st.sampled_from(["a100", "l40s", "nowhere"])),
        gpus=len(slots),
        priority="normal",
        protected=draw(st.booleans()),
        granted_at=NOW - draw(minutes_span),
        expires_at=NOW + draw(minutes_span),
        warnings=draw(marks),
        snoozed_until=draw(st.one_of(st.none(), minutes_span.map(lambda d: NOW + d))),
        slots=slots,
    )
    extra = draw(st.integers(0, 1))  # a reading beyond the slots is judged as gpu_idleness does
    return lease, draw(st.lists(readings, min_size=len(slots) + extra, max_size=len(slots) + extra))


@settings(max_examples=300, deadline=None)
@given(
    lease_and_readings=leases(),
    delivered=st.dictionaries(st.sampled_from(["expiry", "idle", "preempt", "partly_idle"]), when),
)
def test_the_fast_lease_facts_equal_the_plain_ones(
    lease_and_readings: tuple[LeaseSnapshot, list[Reading | None]],
    delivered: dict[str, datetime | None],
) -> None:
    lease, seen = lease_and_readings
    warned = Warned(delivered)
    expected = plain_lease_facts(POLICY, lease, seen, warned, NOW)
    got = lease_facts(POLICY, lease, seen, warned, NOW)
    assert list(expected.items()) == list(got.items())
    assert [type(v) for v in expected.values()] == [type(v) for v in got.values()]
