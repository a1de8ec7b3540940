"""The replay of recorded history as tables: readings rebuilt from stored minutes (unknown is
never idle), the sweep stepped through a lease's life under two policies, the outcome each
policy gives a request's stored facts, and the differences counted."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from functools import cache

import pytest

from rules.engine.reference import ReferenceEngine
from rules.errors import FactError
from rules.loader import load_policy
from rules.minute_trace import GpuTrace, Minute
from rules.policy import Policy
from rules.simulate import (
    LeaseChange,
    RequestChange,
    RequestDecisions,
    lease_changes,
    refreshed,
    request_decision,
    summarise,
)
from rules.sweep_replay import LeaseLife, SweepEvent, SweepReplay, replay_lease
from tests.builders import a_request, default_policy, default_sources

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
STALE = timedelta(minutes=3)
IDLE, BUSY, UNKNOWN = Minute.IDLE, Minute.BUSY, Minute.UNKNOWN


@cache
def candidate() -> Policy:
    """The shipped rules with an idle threshold of 60m, at most 4 GPUs a request, and a
    manager asked for any borrow longer than 4h."""
    sources = default_sources()
    sources["limits.yaml"] = (
        sources["limits.yaml"]
        .replace("idle_threshold: 90m", "idle_threshold: 60m")
        .replace("max_gpus_per_request: 8", "max_gpus_per_request: 4")
    )
    sources["requests.yaml"] = sources["requests.yaml"].replace(
        "request.duration > 1d", "request.duration > 4h"
    )
    return load_policy(sources)


@cache
def strict() -> Policy:
    """The shipped rules comparing idle and clock times strictly, with odd thresholds."""
    sources = default_sources()
    edits = (
        ("lease.idle_for >= limits.idle_threshold and not", "lease.idle_for > 61.5m and not"),
        (
            "lease.since_warned.idle >= limits.grace",
            "lease.since_warned.idle > 29m and 100m < lease.age",
        ),
        (
            "when: lease.partly_idle and",
            "when: lease.idle_gpus_for > 92m and lease.partly_idle and",
        ),
    )
    for old, new in edits:
        assert old in sources["sweep.yaml"]
        sources["sweep.yaml"] = sources["sweep.yaml"].replace(old, new, 1)
    return load_policy(sources)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.mark.parametrize(
    ("case", "states", "now", "fresh", "idle_min"),
    [
        ("three idle minutes", "III", 3, True, 3),
        ("half a minute later, still three", "III", 3.5, True, 3),
        ("a busy minute resets the stretch", "IBII", 4, True, 2),
        ("busy last: fresh, not idle", "IIB", 3, True, 0),
        ("an unknown minute ends the stretch", "IIUI", 4, True, 1),
        ("unknown since, within stale_after: the last working minute", "IIUU", 4, True, 2),
        ("unknown for longer than stale_after: not fresh", "IIUUUU", 6, False, 0),
        ("nothing stored: not fresh", "UU", 2, False, 0),
        ("before the first minute is complete", "I", 0.5, False, 0),
        ("past the stored minutes: stale", "II", 10, False, 0),
    ],
)
def test_a_reading_rebuilt_from_stored_minutes(
    case: str, states: str, now: float, fresh: bool, idle_min: int
) -> None:
    """Fresh only on a working minute within stale_after; idle for the idle minutes in a row
    (I idle, B busy, U unknown)."""
    minutes = [{"I": IDLE, "B": BUSY, "U": UNKNOWN}[c] for c in states]
    reading = GpuTrace(T0, minutes).reading(at(now), STALE)
    assert (fresh, timedelta(minutes=idle_min)) == (reading.fresh, reading.idle_for), case


@pytest.mark.parametrize("seed", range(20))
def test_how_a_reading_goes_on_is_what_reading_it_minute_by_minute_finds(seed: int) -> None:
    """Until where `ahead` says the reading holds, reading it again each minute finds the
    same freshness and state, an idle one's minutes adding up from the stretch it names."""
    rng = random.Random(seed)
    minutes = [rng.choice((IDLE, BUSY, UNKNOWN)) for _ in range(rng.randint(1, 6))]
    minutes = [m for m in minutes for _ in range(rng.randint(1, 12))]
    trace = GpuTrace(T0, minutes)
    for now in (at(m + rng.choice((0, 0.5))) for m in range(len(minutes) + 2)):
        found = trace.ahead(now, STALE)
        first = trace.reading(now, STALE)
        if found is None:
            continue
        since, until = found
        assert (since is not None) == (first.idle_for > timedelta(0))
        if since is not None:
            assert first.idle_for == floor_minute(now) - since
        t = now
        while t + MINUTE_STEP < until:
            t += MINUTE_STEP
            later = trace.reading(t, STALE)
            grown = first.idle_for + (t - now) if since is not None else timedelta(0)
            assert (first.fresh, grown) == (later.fresh, later.idle_for)


MINUTE_STEP = timedelta(minutes=1)


def floor_minute(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0)


def a_life(minutes: int = 100, *, gpus: int = 2, hours: float = 6, late_s: int = 0) -> LeaseLife:
    """Granted at T0 (`late_s` seconds after it: off the minute), ended `minutes` after T0."""
    granted = T0 + timedelta(seconds=late_s)
    return LeaseLife(
        id=7,
        holder="U0BOB0001",
        team="vision",
        pool="a100",
        gpus=gpus,
        priority="normal",
        protected=False,
        granted_at=granted,
        expires_at=granted + timedelta(hours=hours),
        ended_at=at(minutes),
        slots=tuple(("a100-node-01", i) for i in range(gpus)),
    )


def replayed(policy: Policy, life: LeaseLife, states: list[Minute]) -> list[tuple[str, float]]:
    traces = [GpuTrace(T0, states) for _ in life.slots]
    events = replay_lease(
        policy, ReferenceEngine(policy), life, traces, since=T0, until=at(24 * 60)
    )
    return [(e.key, (e.at - T0) / timedelta(minutes=1)) for e in events]


IDLE_100 = [IDLE] * 100


@pytest.mark.parametrize(
    ("case", "policy", "minutes", "states", "expected"),
    [
        (
            "idle 100m, shipped rules: warned at 90m",
            default_policy,
            100,
            IDLE_100,
            [("warn idle", 90)],
        ),
        (
            "idle 100m, 60m threshold: warned at 60m, reclaimed after the 30m grace",
            candidate,
            100,
            IDLE_100,
            [("warn idle", 60), ("reclaim idle", 90)],
        ),
        ("busy all along: nothing", candidate, 100, [BUSY] * 100, []),
        ("no telemetry: unknown is never idle", candidate, 100, [UNKNOWN] * 100, []),
        (
            "busy at 50m: the idle clock starts again",
            candidate,
            130,
            [IDLE] * 50 + [BUSY] + [IDLE] * 79,
            [("warn idle", 115)],
        ),
        (
            "runs past its expiry: warned at each lead, reclaimed 30m after the end",
            default_policy,
            24 * 60,
            [BUSY] * (24 * 60),
            [("warn expiry", 300), ("reclaim expired", 390)],
        ),
    ],
)
def test_the_sweep_replayed_through_a_lease_life(
    case: str,
    policy: object,
    minutes: int,
    states: list[Minute],
    expected: list[tuple[str, float]],
) -> None:
    """Stepped every 5 minutes and at each expiry lead and grace end; warnings are delivered at
    once; nothing follows a reclaim."""
    assert callable(policy)
    assert expected == replayed(policy(), a_life(minutes), states), case


def test_a_lease_idle_before_the_window_starts_unwarned_at_its_start() -> None:
    """A lease granted before `since` is replayed from `since`, with no warning carried in."""
    life = a_life(100)
    traces = [GpuTrace(T0, IDLE_100) for _ in life.slots]
    policy = candidate()
    events = replay_lease(
        policy, ReferenceEngine(policy), life, traces, since=at(30), until=at(24 * 60)
    )
    assert [("warn idle", at(60)), ("reclaim idle", at(90))] == [(e.key, e.at) for e in events]


def event(key: str, minute: float, rule: str = "r") -> SweepEvent:
    action, reason = key.split()
    return SweepEvent(action, reason, at(minute), rule)


@pytest.mark.parametrize(
    ("case", "in_force", "cand", "expected"),
    [
        ("the same: no change", [event("warn idle", 90)], [event("warn idle", 90)], []),
        (
            "a reclaim only the candidate makes frees the rest of the lease",
            [event("warn idle", 90)],
            [event("warn idle", 60), event("reclaim idle", 90)],
            [("warn idle", "earlier", 0.0), ("reclaim idle", "added", 0.33)],
        ),
        (
            "a reclaim only the rules in force make frees less",
            [event("reclaim idle", 90)],
            [],
            [("reclaim idle", "removed", -0.33)],
        ),
        (
            "a later reclaim: the difference of the two",
            [event("reclaim idle", 40)],
            [event("reclaim idle", 70)],
            [("reclaim idle", "later", -1.0)],
        ),
    ],
)
def test_the_changes_on_one_lease(
    case: str,
    in_force: list[SweepEvent],
    cand: list[SweepEvent],
    expected: list[tuple[str, str, float]],
) -> None:
    """GPU-h freed: the lease's GPUs from the reclaim to its real end (2 GPUs, end at 100m)."""
    changes = lease_changes(a_life(100), in_force, cand, until=at(24 * 60))
    got = [(f"{c.action} {c.reason}", c.change, round(c.freed_gpu_h, 2)) for c in changes]
    assert expected == got, case


def test_stored_request_facts_take_the_candidates_limits_and_quota() -> None:
    """What the policy says is re-read; what the pool looked like stays as recorded."""
    stored = a_request(request__gpus=6, team__used=2, team__used_after=8, pool__free=9)
    facts = refreshed(candidate(), {**stored, "limits.max_gpus_per_request": 8})
    assert 4 == facts["limits.max_gpus_per_request"]
    assert (2, 8, 9) == (facts["team.used"], facts["team.used_after"], facts["pool.free"])
    assert 0 == facts["team.borrowed_after"]  # vision's nominal in a100 is 8


@pytest.mark.parametrize(
    ("case", "facts", "in_force", "cand"),
    [
        ("a small short borrow", a_request(request__duration=120.0), "approve", "approve"),
        ("a 6h borrow now needs a manager", a_request(), "approve", "ask managers"),
        (
            "6 GPUs is now more than one request may take",
            a_request(request__gpus=6, team__used_after=6),
            "approve",
            "deny",
        ),
        (
            "the quota invariant holds under both",
            a_request(request__gpus=6, team__used=8, team__used_after=14, team__borrowed_after=6),
            "deny",
            "deny",
        ),
    ],
)
def test_each_policy_decides_the_stored_facts(
    case: str, facts: dict[str, object], in_force: str, cand: str
) -> None:
    got = tuple(
        str(request_decision(p, ReferenceEngine(p), facts).verdict)
        for p in (default_policy(), candidate())
    )
    assert (in_force, cand) == got, case


def random_request(rng: random.Random) -> dict[str, object]:
    """Stored facts from a small set, so that many repeat, some with a value of another
    type (1.0 or True where 1 was stored) or one the catalogue refuses."""
    gpus = rng.choice((1, 2, 4, 6, 9))
    used = rng.choice((0, 2, 8, 12))
    facts = a_request(
        request__gpus=gpus,
        request__duration=rng.choice((60.0, 360.0, 1440.0, 5000.0)),
        request__kind=rng.choice(("borrow", "borrow", "extend")),
        user__id=rng.choice(("U0ALICE01", "U0CAROL01", "U0ADMIN01")),
        team__used=used,
        team__used_after=used + gpus,
        team__borrowed_after=max(0, used + gpus - 8),
        pool__lendable=rng.choice((0, 4)),
    )
    twist = rng.random()
    if twist < 0.1:
        facts["request.gpus"] = float(gpus)
    elif twist < 0.15:
        facts["request.has_reason"] = 1
    elif twist < 0.2:
        facts["team.used"] = [used]  # cannot be a key
    return facts


@pytest.mark.parametrize("seed", range(5))
def test_request_decisions_decided_once_per_distinct_facts_are_those_decided_afresh(
    seed: int,
) -> None:
    """The memo of the simulation gives each request the decision request_decision gives it
    (the whole Decision: outcome, matches, reasons, facts), and refuses what it refuses."""
    rng = random.Random(seed)
    asked = [random_request(rng) for _ in range(300)]
    for policy in (default_policy(), candidate()):
        memo = RequestDecisions(policy, ReferenceEngine(policy))
        for facts in asked:
            try:
                expected: object = request_decision(policy, ReferenceEngine(policy), facts)
            except FactError as e:
                expected = str(e)
            try:
                got: object = memo(facts)
            except FactError as e:
                got = str(e)
            assert expected == got


def a_change(before: str, after: str, waited_s: float | None = None) -> RequestChange:
    return RequestChange(3, "borrow", "U0ALICE01", "a100", 2, before, after, "r", "", waited_s)


@pytest.mark.parametrize(
    ("before", "after", "waited_s", "label", "note"),
    [
        ("approve", "ask managers", None, "approve → ask", ""),
        (
            "approve",
            "queue",
            0.0,
            "approve → queue",
            "would wait in the queue (how long is not simulated)",
        ),
        (
            "queue",
            "approve",
            4800.0,
            "queue → approve",
            "would not wait in the queue (an estimate: it waited 1h 20m)",
        ),
        ("queue", "deny", None, "queue → deny", "would not wait in the queue"),
        ("ask managers", "deny", None, "ask → deny", ""),
    ],
)
def test_a_changed_outcome_says_what_it_does_to_the_wait(
    before: str, after: str, waited_s: float | None, label: str, note: str
) -> None:
    change = a_change(before, after, waited_s)
    assert (label, note) == (change.label, change.queue_note)


def test_the_summary_counts_changes_by_kind_and_names_each_person_once() -> None:
    life = a_life(100)
    swept = [
        LeaseChange(life, "reclaim", "idle", None, at(90), "reclaim-idle", 0.33),
        LeaseChange(life, "warn", "idle", at(90), at(60), "warn-idle"),
        LeaseChange(life, "warn", "expiry", at(30), None, "warn-before-expiry"),
    ]
    changed = [a_change("approve", "ask managers"), a_change("approve", "ask admins")]
    s = summarise(5, 1, 2, changed, swept)
    assert {"approve → ask": 2} == dict(s.outcomes)
    assert (5, 1, 2, 2) == (s.requests, s.not_replayed, s.leases, s.outcomes_changed)
    assert (1, 0, 0, 1) == (
        s.reclaims_added,
        s.reclaims_removed,
        s.warnings_added,
        s.warnings_removed,
    )
    assert (0.33, ("U0ALICE01", "U0BOB0001")) == (s.gpu_h_freed, s.people)


def random_minutes(rng: random.Random, count: int) -> list[Minute]:
    """Runs of busy, idle and unknown minutes, up to three hours each."""
    out: list[Minute] = []
    while len(out) < count:
        out += [rng.choice((IDLE, IDLE, BUSY, BUSY, UNKNOWN))] * rng.randint(1, 180)
    return out[:count]


@pytest.mark.parametrize("seed", range(80))
def test_skipping_quiet_stretches_decides_as_stepping_through_every_step(seed: int) -> None:
    """Random lives (some past their expiry, some granted before the window or off the
    minute) under three policies: the same events whether quiet and idle stretches are
    skipped or every step is taken."""
    rng = random.Random(seed)
    hours = rng.choice((1, 2, 6, 12))
    minutes = rng.randint(30, (hours + 2) * 60)
    late = rng.choice((0, 0, 17, 42))
    life = a_life(minutes, gpus=rng.randint(1, 3), hours=hours, late_s=late)
    traces = [GpuTrace(T0, random_minutes(rng, minutes + 5)) for _ in life.slots]
    since = at(rng.choice((0, 0, 17, 95)))
    for policy in (default_policy(), candidate(), strict()):
        got = [
            SweepReplay(policy, ReferenceEngine(policy), skip=skip).events(
                life, traces, since=since, until=at(24 * 60)
            )
            for skip in (True, False)
        ]
        assert got[0] == got[1]
