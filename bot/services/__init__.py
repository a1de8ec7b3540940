"""The use cases, behind one facade the adapters (Slack, CLI, scheduler) call.

No Slack here: every method takes plain values and returns views or a `Refused`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

from bot.services import (
    admin,
    agents,
    approval_lifecycle,
    borrowing,
    charts,
    device_records,
    devices,
    digests,
    enforcement,
    explain,
    extensions,
    homes,
    leases,
    notice_views,
    overview,
    queueing,
    recall,
    scheduler_steps,
    settling,
    shrinking,
    simulate,
    strangers,
    sweep,
)
from bot.services.borrowing import BorrowAsk
from bot.services.context import SYSTEM, Context, Enforcer, record, utcnow
from bot.services.inventory import sync_inventory
from bot.services.notice_views import Notice
from bot.services.reads import lease_view, list_leases, list_requests, request_view
from bot.services.results import (
    ApprovalEffects,
    BorrowResult,
    Explanation,
    ExtendResult,
    Home,
    LeaseView,
    PoolStatus,
    QueueEntry,
    QuotaUse,
    Refused,
    ReleaseResult,
    RequestView,
    SettleResult,
    ShrinkResult,
)
from bot.services.rule_files import read_rules_dir
from bot.services.sweep_pass import SweepReport
from rules.domain import plural
from rules.engine.live import EngineName, LivePolicy
from rules.errors import PolicyError
from rules.lease_facts import Readings
from rules.policy import Policy
from rules.reports import GroupBy, Scope, Window
from storage import leases as storage_leases
from storage import outbox
from storage import requests as storage_requests
from storage.audit import AuditTag
from storage.db import Database
from storage.gpus import GpuLine, gpu_lines, occupied_lines
from storage.tables import OutboxRow

__all__ = ["BorrowAsk", "Refused", "Services"]


class Services:
    """Borrow, approve, deny, cancel, extend, release, why; plus rules reload and inventory."""

    def __init__(
        self,
        db: Database,
        live: LivePolicy,
        clock: Callable[[], datetime] = utcnow,
        enforcer: Enforcer = "notify",
    ) -> None:
        self.ctx = Context(db, live, clock, enforcer)
        self._hands: scheduler_steps.Hands | None = None  # the scheduler enforcer, once needed
        # Every change a Home tab shows owes the people who see it a redrawn one.
        self._owe_homes = lambda session: homes.owe_homes(session, self.ctx)
        db.before_commit.append(self._owe_homes)

    @classmethod
    def open(
        cls,
        db: Database,
        sources: Mapping[str, str],
        *,
        engine: EngineName = "durable",
        clock: Callable[[], datetime] = utcnow,
        enforcer: Enforcer = "notify",
    ) -> Services:
        """Load the rules (refusing broken ones), then bring the inventory in step with them."""
        services = cls(db, LivePolicy(sources, engine), clock, enforcer)
        services.sync_inventory()
        return services

    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @property
    def db(self) -> Database:
        return self.ctx.db

    def borrow(self, user: str, ask: BorrowAsk) -> BorrowResult | Refused:
        result = borrowing.borrow(self.ctx, user, ask)
        if not isinstance(result, Refused):
            # A guarantee may recall at once; a grant may take GPUs a guarantee counted on.
            recall.reconcile(self.ctx, [result.request.pool])
        return result

    def approve(self, user: str, request_id: int, reason: str = "") -> SettleResult | Refused:
        result = settling.settle(self.ctx, user, request_id, approve=True, reason=reason)
        if not isinstance(result, Refused):
            recall.reconcile(self.ctx, [result.request.pool])
        return result

    def deny(self, user: str, request_id: int, reason: str = "") -> SettleResult | Refused:
        return settling.settle(self.ctx, user, request_id, approve=False, reason=reason)

    def nudge(
        self, user: str, request_id: int
    ) -> approval_lifecycle.Nudged | approval_lifecycle.TooSoon | Refused:
        """The requester's *Remind approvers* (at most once every 15 minutes per request)."""
        return approval_lifecycle.nudge(self.ctx, user, request_id)

    def ask_again(
        self, user: str, request_id: int
    ) -> BorrowResult | approval_lifecycle.AskedAgain | Refused:
        """*Ask again* on an expired request: the same borrow filed once more, once."""
        result = approval_lifecycle.ask_again(self.ctx, user, request_id)
        if isinstance(result, BorrowResult):
            recall.reconcile(self.ctx, [result.request.pool])
        return result

    def waiting_for(self, user: str) -> list[RequestView]:
        """The requests and extensions waiting for `user`'s decision, oldest first."""
        with self.db.read() as session:
            return approval_lifecycle.waiting_for(session, self.ctx, user)

    def may_settle(self, user: str, request_id: int) -> Refused | None:
        return settling.may_settle(self.ctx, user, request_id)

    def cancel(self, user: str, request_id: int) -> RequestView | Refused:
        result = borrowing.cancel(self.ctx, user, request_id)
        if not isinstance(result, Refused):
            # A new head may fit now, and what it recalled may stay.
            self.serve_queue([result.pool])
        return result

    def extend(
        self, user: str, lease_id: int, by: timedelta, reason: str = ""
    ) -> ExtendResult | Refused:
        return extensions.extend(self.ctx, user, lease_id, by, reason)

    def release(self, user: str, lease_id: int | None = None) -> ReleaseResult | Refused:
        result = leases.release(self.ctx, user, lease_id)
        if not isinstance(result, Refused):
            # Freed GPUs go to the queue; withdrawn requests may leave recalls unneeded.
            pools = {lease.pool for lease in result.released}
            self.serve_queue(sorted(pools | {r.pool for r in result.cancelled}))
        return result

    def shrink(
        self,
        user: str,
        lease_id: int,
        *,
        gpus: tuple[tuple[str, int], ...] = (),
        keep: int | None = None,
    ) -> ShrinkResult | Refused:
        """Give back some GPUs of a lease (named, or all but `keep`); the queue is served."""
        return self._served(shrinking.shrink(self.ctx, user, lease_id, gpus=gpus, keep=keep))

    def give_back_idle(self, user: str, lease_id: int) -> ShrinkResult | Refused:
        """The Give back button of a partly-idle warning; the queue is served."""
        return self._served(shrinking.give_back_idle(self.ctx, user, lease_id))

    def keep_all(self, user: str, lease_id: int) -> LeaseView | Refused:
        """The Keep button of a partly-idle warning: no more of them for this lease."""
        return shrinking.keep_all(self.ctx, user, lease_id)

    def _served(self, result: ShrinkResult | Refused) -> ShrinkResult | Refused:
        if isinstance(result, Refused):
            return result
        started = self.serve_queue([result.lease.pool])
        return ShrinkResult(result.lease, result.given_back, tuple(started))

    def serve_queue(self, pools: list[str] | None = None) -> list[LeaseView]:
        """Grant waiting requests that fit now (after a release, and on every sweep)."""
        granted = queueing.serve_queue(self.ctx, pools)
        recall.reconcile(self.ctx, pools)  # what was granted needs no recall any more
        return granted

    def approval_effects(self, request_id: int) -> ApprovalEffects | None:
        with self.db.read() as session:
            row = storage_requests.get(session, request_id)
            return recall.effects_of_approval(self.ctx, session, row) if row else None

    def snooze(self, user: str, lease_id: int) -> LeaseView | Refused:
        return leases.snooze(self.ctx, user, lease_id)

    def record_refused_agent(self, node: str, why: str) -> None:
        """A known node's agent request was refused: at most one aggregated `agent:refused`
        row per node per ten minutes, with the count and the reasons since its last row."""
        agents.record_refused(self.ctx, node, why)

    def spend_nonce(self, node: str, nonce: str, expires_at: datetime) -> bool:
        """Spend an agent request's nonce until `expires_at`; False: spent before (a replay)."""
        return agents.spend_nonce(self.ctx, node, nonce, expires_at)

    def take_orders(self, node: str) -> list[dict[str, Any]]:
        """The pending enforcement orders for `node`, now marked sent (an agent's push)."""
        return enforcement.take_orders(self.ctx, node)

    def record_results(self, node: str, order: int, results: list[dict[str, Any]]) -> str | None:
        """What an agent did with an order; None when recorded, else why not."""
        return enforcement.record_results(self.ctx, node, order, results)

    def enforce(self, kubeconfig: Path | None = None) -> list[str]:
        """The Slurm or Kubernetes enforcer's next steps on the orders and drains waiting
        (the sweep job, once the sweep committed); a line for each that settled or failed."""
        if self._hands is None:
            self._hands = scheduler_steps.Hands(self.ctx.enforcer, kubeconfig)
        return scheduler_steps.carry_out(self.ctx, self._hands)

    def sweep(self, readings: Readings) -> SweepReport:
        """One pass of the reconcile loop (the scheduler's `sweep` job, or a test, calls it)."""
        return sweep.sweep(self.ctx, readings)

    def observe_fleet(self, fleet: devices.Fleet, since: datetime | None) -> devices.DeviceReport:
        """Write down what telemetry shows (after each poll); `since`: when
        samples began to be expected, None when no telemetry is configured."""
        return devices.observe(self.ctx, fleet, since=since)

    def fleet_lines(self) -> list[GpuLine]:
        """Every GPU and where it stands (free, leased, occupied, not reporting, out)."""
        with self.db.read() as session:
            return gpu_lines(session)

    def unreserved(self) -> list[str]:
        """GPUs in use without a lease: "a100-node-02:6 by dave" (read without a line for
        every GPU of the fleet)."""
        with self.db.read() as session:
            found = occupied_lines(session)
        return [
            f"{g.node}:{g.index} by {', '.join(u for u in g.occupants if u) or 'an unnamed user'}"
            for g in found
        ]

    def strays(self) -> dict[str, int]:
        """Nodes that report without being in pools.yaml: {name: GPUs reported}."""
        with self.db.read() as session:
            return strangers.strays(session)

    def intrusions(self) -> list[str]:
        """Leased GPUs where someone else's process runs: "L8 a100-node-02:6 by dave"."""
        with self.db.read() as session:
            return strangers.intrusions(session)

    def why(self, user: str, ref: str, *, tz: tzinfo = UTC) -> Explanation | Refused:
        return explain.why(self.ctx, user, ref, tz=tz)

    def leases(self, holder: str | None = None, *, active_only: bool = True) -> list[LeaseView]:
        with self.db.read() as session:
            return list_leases(session, holder=holder, active_only=active_only)

    def requests(self, requester: str | None = None) -> list[RequestView]:
        with self.db.read() as session:
            return list_requests(session, requester=requester)

    def request(self, request_id: int) -> RequestView | None:
        with self.db.read() as session:
            row = storage_requests.get(session, request_id)
            return request_view(row) if row else None

    def lease(self, lease_id: int) -> LeaseView | None:
        with self.db.read() as session:
            row = storage_leases.get(session, lease_id)
            return lease_view(session, row) if row else None

    def audit(self, user: str, ref: str, *, tz: tzinfo = UTC) -> Explanation | Refused:
        return explain.audit_trail(self.ctx, user, ref, tz=tz)

    def status(self) -> list[PoolStatus]:
        with self.db.read() as session:
            return overview.pool_status(session, self.ctx)

    def quota(self, team: str) -> list[QuotaUse] | Refused:
        if team not in self.policy.teams:
            teams = ", ".join(sorted(self.policy.teams))
            return Refused(f"There is no team `{team}`. Teams: {teams}.", "no-team")
        with self.db.read() as session:
            return overview.quota_use(session, self.ctx, team, fair_share=True)

    def queue(self) -> list[RequestView]:
        with self.db.read() as session:
            return overview.queue(session, self.ctx)

    def queue_explained(self) -> list[QueueEntry]:
        """The queue, pool by pool, each request with its place, its reasons and its recalls."""
        with self.db.read() as session:
            return recall.queue_entries(self.ctx, session)

    def home(self, user: str) -> Home:
        with self.db.read() as session:
            return overview.home(session, self.ctx, user, paused=admin.is_paused(session, self.ctx))

    def paused(self) -> bool:
        with self.db.read() as session:
            return admin.is_paused(session, self.ctx)

    def pause(self, user: str) -> str | Refused:
        return admin.set_paused(self.ctx, user, paused=True)

    def resume(self, user: str) -> str | Refused:
        return admin.set_paused(self.ctx, user, paused=False)

    def drain(self, user: str, node: str, reason: str = "") -> str | Refused:
        return admin.set_drained(self.ctx, user, node, drained=True, reason=reason)

    def undrain(self, user: str, node: str, reason: str = "") -> str | Refused:
        return admin.set_drained(self.ctx, user, node, drained=False, reason=reason)

    def nodes(
        self, user: str, name: str | None = None
    ) -> list[device_records.NodeProfile] | Refused:
        """Every node (or one) with its GPUs, for admins."""
        if not self.policy.is_admin(user):
            return Refused("`/gpu nodes` is for gpubot admins.", "not-admin")
        with self.db.read() as session:
            found = device_records.profiles(session, name)
        if name is not None and not found:
            names = ", ".join(sorted(n for p in self.policy.pools.values() for n in p.nodes))
            reported = self.strays().get(name)
            if reported is not None:
                return Refused(
                    f"`{name}` reports {plural(reported, 'GPU')} but is in no pool of "
                    f"pools.yaml, so nothing is granted on it. Configured nodes: {names}.",
                    "no-node",
                )
            return Refused(f"There is no node `{name}`. Nodes: {names}.", "no-node")
        return found

    def node_history(
        self, name: str | None = None, limit: int | None = None
    ) -> list[device_records.DeviceEvent]:
        with self.db.read() as session:
            return device_records.history(session, name, limit=limit)

    def sync_inventory(self, actor: str = SYSTEM) -> list[str]:
        with self.db.write() as session:
            return sync_inventory(session, self.policy, at=self.ctx.now(), actor=actor)

    def reload_rules(self, actor: str, sources: Mapping[str, str]) -> Policy:
        """Swap in new rule files if they load and pass their cases; audit either way.

        Raises PolicyError (with every problem located) and keeps the rules in force.
        """
        before = self.policy.revision
        now = self.ctx.now()
        try:
            policy = self.ctx.live.reload(sources)
        except PolicyError as exc:
            with self.db.write() as session:
                record(
                    session,
                    at=now,
                    actor=actor,
                    tag=AuditTag.RULES_REJECTED,
                    subject="rules",
                    outcome="rejected",
                    detail={"in_force": before, "problems": [str(p) for p in exc.problems]},
                )
            raise
        with self.db.write() as session:
            record(
                session,
                at=now,
                actor=actor,
                tag=AuditTag.RULES_RELOADED,
                subject="rules",
                outcome="reloaded",
                detail={"from": before, "to": policy.revision, "files": list(policy.files)},
            )
            sync_inventory(session, policy, at=now, actor=actor)
        return policy

    def send_digests(self) -> int:
        """Owe the scheduled digests now due, once per period; how many messages were owed.
        Digests report and take nothing: they go out even while automation is paused."""
        return digests.run(self.ctx, self.now())

    def digest(self, owed: OutboxRow) -> digests.LabDigest | digests.PersonalDigest | None:
        """What an owed digest says, read now (None: nothing to say)."""
        return digests.view(self.ctx, owed)

    def notice(self, outbox_id: int) -> Notice | None:
        """What an owed message says as its subject stands now (None: nothing left to say)."""
        with self.db.read() as session:
            row = outbox.get(session, outbox_id)
            return notice_views.notice(session, self.ctx, row) if row else None

    def report_file(
        self,
        viewer: str,
        scope: Scope,
        window: Window,
        *,
        fmt: charts.FileFormat,
        channel: str,
        asked: str = "",
        by: GroupBy | None = None,
    ) -> Refused | None:
        """A report's chart (`png`) or CSV, owed to `viewer` in `channel` (a conversation, or
        a person's id for their DM): refused when they may not see it (bot.services.charts)."""
        return charts.owe_file(
            self.ctx, viewer, scope, window, fmt=fmt, channel=channel, asked=asked, by=by
        )

    def simulation_note(self, revision: str) -> str | None:
        """The line `/gpu admin reload` adds when `gpubot rules simulate` ran on `revision`."""
        return simulate.reload_note(self.db, revision)

    def reload_rules_dir(self, actor: str, directory: Path) -> Policy:
        """Read the rule files in `directory` and reload them (`reload_rules`). Raises
        RulesDirError when there are none to read, PolicyError when they do not load."""
        return self.reload_rules(actor, read_rules_dir(directory))

    def now(self) -> datetime:
        """The clock every use case reads (a test's or the demo's when they set one)."""
        return self.ctx.now()

    @property
    def engine_name(self) -> str:
        """The engine deciding now ("durable", or the pure-Python reference)."""
        return self.ctx.live.engine_name

    def close(self) -> None:
        """Free the compiled rules (the engine keeps them until told)."""
        if self._owe_homes in self.ctx.db.before_commit:
            self.ctx.db.before_commit.remove(self._owe_homes)
        self.ctx.live.close()
