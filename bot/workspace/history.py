"""The demo's past: two weeks of ended leases, the requests that led to them and each GPU's
hourly use, before the demo starts, so that `/gpu report` has a week worth reading.

All of it is made up and says so: every seeded lease and request reason starts with `MARK`,
every seeded audit row's detail carries `seeded`. The plan is a fixed table, so every demo
shows the same figures; times count back from the hour the demo starts in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from rules.policy import Policy
from storage import keyvalue
from storage.audit import AuditTag
from storage.db import Database
from storage.history import PastEvent, PastHour, PastLease, PastRequest, write

MARK = "[demo history]"
QUIET = timedelta(hours=3)
HOUR_S = 3600.0
BOT = "gpubot"

ALICE, BOB, VICTOR = "U0ALICE01", "U0BOB0001", "U0VMGR001"
CAROL, DAVE, NADIA = "U0CAROL01", "U0DAVE001", "U0NMGR001"
ERIN, ADA = "U0ERIN001", "U0ADMIN01"

Kind = Literal["busy", "idle", "unknown"]
Ending = Literal["released", "expired", "idle", "preempted"]


@dataclass(frozen=True)
class Run:
    """Consecutive hours a lease's GPUs spent alike: busy at `util_pct`, idle (allocated, seen,
    under the busy threshold) or unknown (no working reading)."""

    hours: int
    kind: Kind
    util_pct: float = 0.0
    memory_mib: int | None = None


def busy(hours: int, util_pct: float, memory_mib: int) -> Run:
    return Run(hours, "busy", util_pct, memory_mib)


def idle(hours: int, util_pct: float = 0.0, memory_mib: int | None = None) -> Run:
    return Run(hours, "idle", util_pct, memory_mib)


def unknown(hours: int) -> Run:
    return Run(hours, "unknown")


def cycle(hours: int, *runs: Run) -> tuple[Run, ...]:
    """`runs` over and over until `hours` are filled, the last one cut short."""
    out: list[Run] = []
    left = hours
    while left > 0:
        for run in runs:
            if left <= 0:
                break
            out.append(Run(min(run.hours, left), run.kind, run.util_pct, run.memory_mib))
            left -= run.hours
    return tuple(out)


@dataclass(frozen=True)
class Past:
    """One seeded lease: who, where, when (`day`s before the demo's start hour, then `hour`
    hours on), what its GPUs did each hour, and how it was asked for and how it ended."""

    holder: str
    pool: str
    gpus: str  # "node:0-3" or "node:5"
    day: int
    hour: int
    shape: tuple[Run, ...]
    asked_h: int
    ended: Ending
    reason: str
    waited_min: int = 0
    outcome: Literal["approve", "ask", "queue"] = "approve"
    rule: str = "within-nominal"
    approver: str = BOT
    extended_h: int = 0

    @property
    def hours(self) -> int:
        return sum(run.hours for run in self.shape)

    def slots(self) -> tuple[tuple[str, int], ...]:
        node, _, span = self.gpus.partition(":")
        first, _, last = span.partition("-")
        return tuple((node, index) for index in range(int(first), int(last or first) + 1))


A100, L40S = 74500, 30000
SERVING = (busy(16, 42, 70100), idle(8, 1, 70100))  # daytime load, quiet nights, weights held
TUNING = (busy(10, 88, 66000), idle(1, 3, 66000))  # an evaluation pause every eleventh hour

#: The two weeks, oldest first in each week. The last seven days (day 7 to day 1) hold the
#: figures the tests compute by hand; no lease crosses the hour seven days before the start,
#: and all of it ends by `QUIET` before the start hour (the hourly rollup rolls the hours
#: just before its marker again, from the minutes, which the seeded past has none of).
PLAN: tuple[Past, ...] = (
    # -- the week before -------------------------------------------------------------------
    Past(ERIN, "inference", "infer-node-01:0-3", 14, 1, cycle(167, *SERVING), 720, "released",
         f"{MARK} inference service v1", 20, "ask", "protected-pool-needs-an-admin", ADA),
    Past(CAROL, "a100", "a100-node-02:0-3", 14, 3, cycle(72, *TUNING), 72, "expired",
         f"{MARK} Llama fine-tuning, 4 GPUs", 30, "ask", "long-borrow-needs-a-manager", NADIA),
    Past(ALICE, "a100", "a100-node-01:0-3", 13, 9, (busy(16, 93, A100), idle(4)), 24,
         "released", f"{MARK} detection baseline"),
    Past(BOB, "a100", "a100-node-01:4-5", 12, 10, (busy(3, 55, 31000), idle(5, 0, 31000)), 12,
         "idle", f"{MARK} notebook: augmentation experiments"),
    Past(DAVE, "a100", "a100-node-02:4-5", 11, 9, (busy(8, 80, 52000),), 10, "released",
         f"{MARK} tokenizer benchmark"),
    Past(ERIN, "l40s", "l40s-node-01:0-1", 10, 6, (busy(10, 74, L40S),), 12, "released",
         f"{MARK} batch embeddings, week 1"),
    Past(ALICE, "a100", "a100-node-01:0-7", 9, 8, (busy(20, 94, A100), idle(4)), 24,
         "released", f"{MARK} segmentation sweep, 8 GPUs"),
    Past(BOB, "l40s", "l40s-node-02:1", 9, 14, (unknown(6),), 8, "released",
         f"{MARK} quick inference test"),
    Past(CAROL, "l40s", "l40s-node-01:3", 8, 9, (busy(10, 81, L40S),), 12, "released",
         f"{MARK} evaluation harness"),
    # -- the last seven days ---------------------------------------------------------------
    Past(ERIN, "inference", "infer-node-01:0-3", 7, 3, cycle(161, *SERVING), 720, "released",
         f"{MARK} inference service v2", 20, "ask", "protected-pool-needs-an-admin", ADA),
    Past(CAROL, "a100", "a100-node-02:0-1", 7, 4, cycle(48, *TUNING), 48, "released",
         f"{MARK} Llama fine-tuning, 2 GPUs", 15, "ask", "long-borrow-needs-a-manager", NADIA),
    Past(ALICE, "a100", "a100-node-01:0-3", 7, 9, (busy(8, 95, A100), idle(2)), 12,
         "released", f"{MARK} ResNet-50 ablations"),
    Past(BOB, "a100", "a100-node-01:4-5", 6, 10, (busy(2, 60, 31000), idle(4, 0, 31000)), 8,
         "idle", f"{MARK} notebook: data loader profiling"),
    Past(DAVE, "a100", "a100-node-02:2-3", 6, 9, (busy(2, 79, 40000), idle(4)), 8,
         "released", f"{MARK} retrieval eval"),
    Past(ERIN, "l40s", "l40s-node-01:0", 6, 6, (busy(8, 76, L40S),), 10, "released",
         f"{MARK} batch embeddings, week 2"),
    Past(ALICE, "a100", "a100-node-01:0-5", 5, 8, (busy(24, 90, A100), unknown(4),
         busy(4, 90, A100)), 26, "expired", f"{MARK} ViT-L pretraining", 25, "ask",
         "long-borrow-needs-a-manager", VICTOR, extended_h=6),
    Past(DAVE, "a100", "a100-node-02:5", 5, 12, (busy(6, 75, 38000), unknown(4)), 12,
         "released", f"{MARK} distillation run"),
    Past(BOB, "l40s", "l40s-node-02:1", 4, 13, (idle(8, 0, 6100),), 12, "idle",
         f"{MARK} notebook left open"),
    Past(CAROL, "l40s", "l40s-node-01:3", 4, 9, (busy(10, 82, L40S),), 12, "released",
         f"{MARK} evaluation harness"),
    Past(ALICE, "a100", "a100-node-01:0-7", 3, 8, (busy(8, 92, A100),), 10, "released",
         f"{MARK} segmentation sweep, 8 GPUs"),
    Past(ALICE, "a100", "a100-node-02:4-7", 3, 9, (busy(6, 85, A100),), 12, "preempted",
         f"{MARK} extra seeds on borrowed GPUs", 40, "ask", "borrowing-needs-a-manager",
         VICTOR),
    Past(CAROL, "a100", "a100-node-02:4-7", 3, 15, (busy(18, 91, 66000), idle(2, 3, 66000)),
         24, "released", f"{MARK} reward model, inside nlp's quota", 120, "queue",
         "not-enough-free"),
    Past(BOB, "a100", "a100-node-01:0-1", 2, 14, (busy(3, 70, 28000), idle(2)), 8,
         "released", f"{MARK} small finetune", 90, "queue", "others-are-waiting"),
    Past(DAVE, "a100", "a100-node-02:0-3", 2, 8, (busy(30, 86, 60000),), 32, "released",
         f"{MARK} pretraining ablation", 10, "ask", "long-borrow-needs-a-manager", NADIA),
    Past(ERIN, "l40s", "l40s-node-01:0-1", 2, 10, (busy(6, 70, L40S), idle(6)), 10,
         "released", f"{MARK} index rebuild", 5, extended_h=4),
    Past(ALICE, "l40s", "l40s-node-02:2-3", 1, 7, (busy(12, 80, L40S),), 14, "released",
         f"{MARK} demo video renders"),
)  # fmt: skip

#: Work run without a lease, busy all along: (node, index, day, hour, hours).
UNRESERVED: tuple[tuple[str, int, int, int, int], ...] = (
    ("a100-node-02", 6, 6, 10, 3),  # dave, as on the demo's first day
    ("a100-node-02", 6, 2, 15, 2),
    ("l40s-node-01", 2, 3, 8, 4),  # carol
)


def start_hour(start: datetime) -> datetime:
    """The hour the demo starts in: the seeded past ends before it."""
    return start.replace(minute=0, second=0, microsecond=0)


def history(start: datetime, policy: Policy) -> tuple[list[PastLease], list[PastHour]]:
    """The plan as rows to write, counted back from the hour `start` falls in."""
    origin = start_hour(start)
    leases = [_lease(past, origin, policy) for past in PLAN]
    hours = [hour for number, past in enumerate(PLAN) for hour in _hours(past, number, origin)]
    for node, index, day, hour, length in UNRESERVED:
        pool = _pool_of(policy, node)
        first = origin - timedelta(days=day, hours=-hour)
        hours += [
            PastHour(first + timedelta(hours=h), pool, node, index, None,
                     unreserved_s=HOUR_S, memory_peak_mib=22000)
            for h in range(length)
        ]  # fmt: skip
    return leases, hours


def _pool_of(policy: Policy, node: str) -> str:
    return next(pool.name for pool in policy.pools.values() if node in pool.nodes)


def _hours(past: Past, number: int, origin: datetime) -> Iterator[PastHour]:
    first = origin - timedelta(days=past.day, hours=-past.hour)
    offset = 0
    for run in past.shape:
        for h in range(run.hours):
            for node, index in past.slots():
                yield PastHour(
                    first + timedelta(hours=offset + h), past.pool, node, index, number,
                    allocated_s=HOUR_S,
                    used_s=HOUR_S * run.util_pct / 100,
                    busy_s=HOUR_S if run.kind == "busy" else 0.0,
                    idle_s=HOUR_S if run.kind == "idle" else 0.0,
                    unknown_s=HOUR_S if run.kind == "unknown" else 0.0,
                    memory_peak_mib=run.memory_mib if run.kind != "unknown" else None,
                )  # fmt: skip
        offset += run.hours


def _lease(past: Past, origin: datetime, policy: Policy) -> PastLease:
    team = policy.team_of(past.holder)
    assert team is not None, f"{past.holder} is in no team of the demo's rules"
    granted = origin - timedelta(days=past.day, hours=-past.hour)
    ended = granted + timedelta(hours=past.hours)
    expires = granted + timedelta(hours=past.asked_h + past.extended_h)
    route = team.approval_channel or "managers"
    borrow = PastRequest(
        kind="borrow",
        gpus=len(past.slots()),
        duration_s=past.asked_h * 3600,
        outcome=past.outcome,
        deciding_rule=past.rule,
        created_at=granted - timedelta(minutes=past.waited_min),
        decided_at=granted,
        decided_by=past.approver,
        approvers=(past.approver,) if past.outcome == "ask" else (),
        approval_route=route if past.outcome == "ask" else "",
    )
    extension = None
    if past.extended_h:
        asked = expires - timedelta(hours=past.extended_h + 1)  # at the hour's warning
        extension = PastRequest(
            "extend", len(past.slots()), past.extended_h * 3600, "approve",
            "extension-within-limits", asked, asked, BOT,
        )  # fmt: skip
    state, why = ("released", "released") if past.ended == "released" else ("reclaimed", "")
    return PastLease(
        holder=past.holder,
        team=team.name,
        pool=past.pool,
        gpus=past.slots(),
        reason=past.reason,
        granted_at=granted,
        expires_at=expires,
        ended_at=ended,
        state=state,
        end_reason=why or past.ended,
        borrow=borrow,
        extension=extension,
        events=_events(past, team.name, ended),
        protected=policy.pools[past.pool].protected,
    )


def _events(past: Past, team: str, ended: datetime) -> tuple[PastEvent, ...]:
    """What the audit log holds after the grant: the warning before a reclaim (none is taken
    unwarned), a recall, and the end."""
    if past.ended == "released":
        return (PastEvent(ended, past.holder, AuditTag.LEASE_RELEASED, "released",
                          {"why": "released"}),)  # fmt: skip
    reclaim = PastEvent(
        ended, BOT, AuditTag.SWEEP_RECLAIM, f"reclaim {past.ended}", {"reason": past.ended}
    )
    end = PastEvent(ended, BOT, AuditTag.LEASE_RECLAIMED, "reclaimed", {"why": past.ended})
    if past.ended == "preempted":
        recall = PastEvent(
            ended - timedelta(hours=2), BOT, AuditTag.LEASE_RECALLED, "recall",
            {"for_team": "nlp", "because": "nlp needs its nominal GPUs back", "gpus": 4},
        )  # fmt: skip
        return recall, reclaim, end
    lead = timedelta(hours=1) if past.ended == "expired" else timedelta(minutes=30)
    warned = PastEvent(ended - lead, BOT, AuditTag.LEASE_WARNED, "warn", {"reason": past.ended})
    return warned, reclaim, end


def seed(db: Database, policy: Policy, start: datetime) -> int:
    """Write the two weeks before `start` in one transaction; the number of leases seeded."""
    leases, hours = history(start, policy)
    with db.write() as session:
        write(session, leases, hours, mark=MARK)
        # The hourly rollup starts at the start hour: before it lie the seeded hours, which it
        # would roll again from the minutes the made-up past does not have.
        keyvalue.set_rolled_until(session, start_hour(start), at=start, by=BOT)
    return len(leases)
