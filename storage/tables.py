"""The SQLModel tables. Every class ends in `Row` so the storage boundary shows in imports.

All datetimes are timezone-aware UTC (`UtcDateTime` stores them as such on SQLite too).
Invariant 1 lives here: `ix_lease_gpu_active` is a partial unique index over the GPUs of active
leases, so the database itself refuses a GPU in two active leases.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from rules.marks import Marks
from storage.marks import MarksJSON


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp that refuses naive datetimes and always comes back aware (UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use aware UTC datetimes")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _ts(*, nullable: bool = False, index: bool = False) -> Any:
    return Field(default=None, sa_column=sa.Column(UtcDateTime(), nullable=nullable, index=index))


def _json(*, nullable: bool = False) -> Any:
    return Field(
        default_factory=dict, sa_column=sa.Column(sa.JSON(), nullable=nullable, default=dict)
    )


class PoolRow(SQLModel, table=True):
    __tablename__ = "pool"

    name: str = Field(primary_key=True, max_length=64)
    model: str = Field(default="", max_length=128)
    protected: bool = False


class NodeRow(SQLModel, table=True):
    __tablename__ = "node"
    __table_args__ = (
        # the drained nodes (few), asked for by status and /metrics on every call
        sa.Index(
            "ix_node_drained",
            "id",
            sqlite_where=sa.text("drained = 1"),
            postgresql_where=sa.text("drained"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, max_length=128)
    pool: str = Field(foreign_key="pool.name", max_length=64, index=True)
    drained: bool = False
    # reporting | silent | unknown (rules.domain.Reporting): silent means configured, expected
    # to report, and no sample for longer than the rules' `fleet.not_reporting_after`.
    reporting: str = Field(default="unknown", max_length=16)
    reporting_since: datetime | None = _ts(nullable=True)
    driver: str = Field(default="", max_length=32)
    cuda: str = Field(default="", max_length=16)


class GpuRow(SQLModel, table=True):
    __tablename__ = "gpu"
    __table_args__ = (
        sa.UniqueConstraint("node_id", "index", name="uq_gpu_node_index"),
        # where a GPU stands, but for its node: status and placement count it here
        sa.Index(
            "ix_gpu_pool_held_state_observed_model",
            "pool",
            "held",
            "state",
            "observed",
            "model",
            "node_id",
        ),
        # each node's newest telemetry, one probe per node (/metrics)
        sa.Index("ix_gpu_node_profiled", "node_id", "profiled_at"),
        # the pool's GPUs, free or held: status counts most of them over a range of this one,
        # a third the size of the one above
        sa.Index("ix_gpu_pool_held", "pool", "held"),
    )

    id: int | None = Field(default=None, primary_key=True)
    node_id: int = Field(foreign_key="node.id", index=True)
    index: int
    uuid: str | None = Field(default=None, max_length=96, unique=True)
    model: str = Field(default="", max_length=128)
    memory_mib: int = 0
    pool: str = Field(foreign_key="pool.name", max_length=64)  # indexed with held, above
    # ok | unhealthy | unknown | drained (rules.domain.GpuState)
    state: str = Field(default="ok", max_length=16)
    # What telemetry last showed (rules.domain.Observed): empty | occupied | unknown | silent.
    # Placement offers empty GPUs first, unknown ones last, and never occupied or silent ones.
    observed: str = Field(default="unknown", max_length=16)
    observed_since: datetime | None = _ts(nullable=True)
    # The processes seen on it: [{pid, user, memory_mib}] (user "" when it cannot be named).
    occupants: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=sa.Column(sa.JSON(), nullable=False, default=list)
    )
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    profiled_at: datetime | None = _ts(nullable=True)
    # In an active lease: kept by the database itself from lease_gpu (HELD_TRIGGERS), never
    # written by code, so that counting where GPUs stand reads one index, not every lease.
    held: bool = Field(
        default=False,
        sa_column=sa.Column(sa.Boolean(), nullable=False, default=False, server_default=sa.false()),
    )


class DeviceEventRow(SQLModel, table=True):
    """One event in a node's or GPU's life (`gpu` None: the node): joined, left, not reporting,
    back, drained, undrained, fault, recovered, swapped (a new UUID), unknown node."""

    __tablename__ = "device_event"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = _ts(index=True)
    node: str = Field(max_length=128, index=True)
    gpu: int | None = None
    kind: str = Field(max_length=32)
    actor: str = Field(max_length=64)
    detail: dict[str, Any] = _json()


class RequestRow(SQLModel, table=True):
    """A borrow or extend request as a person asked for it, and how it was settled."""

    __tablename__ = "request"
    # /metrics counts requests by these up to a time, read from the index alone
    # (storage.metrics_history).
    __table_args__ = (
        sa.Index(
            "ix_request_pool_team_kind_outcome_created",
            "pool",
            "team",
            "kind",
            "outcome",
            "created_at",
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=16)  # borrow | extend
    requester: str = Field(max_length=64, index=True)
    team: str = Field(max_length=64, index=True)
    pool: str = Field(max_length=64, index=True)
    gpus: int
    duration_s: int
    priority: str = Field(default="normal", max_length=16)
    reason: str = Field(default="", max_length=2000)
    # pending | queued | approved | denied | cancelled (rules.domain.RequestState)
    state: str = Field(max_length=16, index=True)
    outcome: str = Field(max_length=16)  # what the rules said
    approvers: list[str] = Field(
        default_factory=list, sa_column=sa.Column(sa.JSON(), nullable=False)
    )
    approval_route: str = Field(default="", max_length=128)  # channel id or "managers"
    lease_id: int | None = Field(default=None, foreign_key="lease.id", index=True)
    audit_id: int | None = None  # the audit row holding the decision's explanation
    created_at: datetime = _ts(index=True)
    decided_at: datetime | None = _ts(nullable=True)
    decided_by: str | None = Field(default=None, max_length=64)
    # The approval lifecycle (rules.approval_clock) while it waits for a person.
    reminders: int = 0
    reminded_at: datetime | None = _ts(nullable=True)
    escalated_at: datetime | None = _ts(nullable=True)
    nudged_at: datetime | None = _ts(nullable=True)  # the requester's "Remind approvers"
    told_at: datetime | None = _ts(nullable=True)  # an extension still waits near the lease end
    asked_again_id: int | None = None  # the request its requester filed with Ask again, once


class ApprovalRow(SQLModel, table=True):
    """One person's verdict on one request. Unique per request: exactly one decision wins."""

    __tablename__ = "approval"

    id: int | None = Field(default=None, primary_key=True)
    request_id: int = Field(foreign_key="request.id", unique=True)
    approver: str = Field(max_length=64)
    verdict: str = Field(max_length=16)  # approve | deny
    reason: str = Field(default="", max_length=2000)
    at: datetime = _ts()


#: A lease being recalled (its marks hold a recall, rules.marks), as each database writes it:
#: the condition of ix_lease_recalled, which a query repeats word for word to be served by it
#: (storage.leases), so that finding the recalls under way reads those leases, not the pool's.
RECALLED_WHERE = {
    "sqlite": "state = 'active' AND json_extract(warnings, '$.recall') IS NOT NULL",
    "postgresql": "state = 'active' AND (warnings ->> 'recall') IS NOT NULL",
}


class LeaseRow(SQLModel, table=True):
    __tablename__ = "lease"
    # The recall cooldown asks for the leases preempted since a time (bot.services.recall);
    # /metrics, for the leases that ended since its checkpoint (storage.metrics).
    __table_args__ = (
        sa.Index("ix_lease_end_reason_ended_at", "end_reason", "ended_at"),
        sa.Index("ix_lease_ended_at_state", "ended_at", "state"),
        # Fair share sums a pool's active leases and those ended since an instant from this
        # index alone.
        sa.Index(
            "ix_lease_pool_state_ended", "pool", "state", "ended_at", "team", "gpus", "granted_at"
        ),
        # Quota sums (GPUs held per team in a pool) read this index alone.
        sa.Index("ix_lease_pool_state_team_gpus", "pool", "state", "team", "gpus"),
        # The queue's timeline reads a pool's active leases in order of expiry, only as far as
        # backfill looks.
        sa.Index("ix_lease_pool_state_expires", "pool", "state", "expires_at", "id"),
        sa.Index(
            "ix_lease_recalled",
            "pool",
            "state",
            sqlite_where=sa.text(RECALLED_WHERE["sqlite"]),
            postgresql_where=sa.text(RECALLED_WHERE["postgresql"]),
        ),
        # /metrics sums the active leases' GPUs and GPU-seconds from this index alone; partial,
        # so that it holds the active leases only and no count over the history reads it.
        sa.Index(
            "ix_lease_active_team_pool_granted",
            # state: one value here, but SQLite reads a partial index only for a lookup; team
            # before pool, or a quota sum of one pool would read this one instead of its own
            "state",
            "team",
            "pool",
            "granted_at",
            "gpus",
            sqlite_where=sa.text("state = 'active'"),
            postgresql_where=sa.text("state = 'active'"),
        ),
        # /metrics counts the ended leases (reclaims by reason, GPU-seconds held) over the
        # whole history from this index alone.
        sa.Index(
            "ix_lease_ended_state_team",
            "state",
            "pool",
            "team",
            "end_reason",
            "ended_at",
            "granted_at",
            "gpus",
            sqlite_where=sa.text("ended_at IS NOT NULL"),
            postgresql_where=sa.text("ended_at IS NOT NULL"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    holder: str = Field(max_length=64, index=True)
    team: str = Field(max_length=64, index=True)
    pool: str = Field(max_length=64, index=True)
    gpus: int
    priority: str = Field(default="normal", max_length=16)
    protected: bool = False
    reason: str = Field(default="", max_length=2000)
    # active | released | reclaimed | expired ... (rules.domain.LeaseState)
    state: str = Field(max_length=16, index=True)
    granted_at: datetime = _ts()
    expires_at: datetime = _ts(index=True)
    ended_at: datetime | None = _ts(nullable=True)
    end_reason: str = Field(default="", max_length=64)
    extensions: int = 0
    extended_s: int = 0
    # What the bot marked on the lease: warnings owed, a recall, one-time notices (rules.marks).
    warnings: Marks = Field(
        default_factory=Marks,
        sa_column=sa.Column(MarksJSON(), nullable=False, default=dict),
    )
    snoozes: int = 0
    snoozed_until: datetime | None = _ts(nullable=True)


class LeaseGpuRow(SQLModel, table=True):
    """The GPUs of a lease. `active` is cleared when the lease ends or gives the GPU back (a
    shrink, which also sets `released_at`); see ix_lease_gpu_active."""

    __tablename__ = "lease_gpu"
    __table_args__ = (
        sa.Index(
            "ix_lease_gpu_active",
            "gpu_id",
            unique=True,
            sqlite_where=sa.text("active"),
            postgresql_where=sa.text("active"),
        ),
        # the GPUs a shrink gave back, for /metrics (few: most rows never get a released_at)
        sa.Index(
            "ix_lease_gpu_given_back",
            "lease_id",
            sqlite_where=sa.text("released_at IS NOT NULL"),
            postgresql_where=sa.text("released_at IS NOT NULL"),
        ),
        # the leases that ever held a GPU, whether or not they still do (the primary key
        # leads with lease_id)
        sa.Index("ix_lease_gpu_gpu_id", "gpu_id"),
    )

    lease_id: int = Field(foreign_key="lease.id", primary_key=True)
    gpu_id: int = Field(foreign_key="gpu.id", primary_key=True)
    active: bool = True
    released_at: datetime | None = _ts(nullable=True)  # given back while the lease ran on


class AuditRow(SQLModel, table=True):
    """One decision or state change. Append-only; `hash` chains each row to the one before."""

    __tablename__ = "audit"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = _ts(index=True)
    actor: str = Field(max_length=64)
    tag: str = Field(max_length=64, index=True)  # subject:action, e.g. lease:granted
    subject: str = Field(max_length=64, index=True)  # e.g. lease:12, request:7, rules
    outcome: str = Field(default="", max_length=32)
    deciding_rule: str = Field(default="", max_length=128)
    matching_rules: list[str] = Field(
        default_factory=list, sa_column=sa.Column(sa.JSON(), nullable=False)
    )
    facts: dict[str, Any] = _json()
    detail: dict[str, Any] = _json()
    revision: str = Field(default="", max_length=80)
    engine: str = Field(default="", max_length=16)
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64, unique=True)


class AuditHeadRow(SQLModel, table=True):
    """The chain's head, one row, locked by every appender so the chain never forks."""

    __tablename__ = "audit_head"

    id: int = Field(default=1, primary_key=True)
    last_id: int = 0
    last_hash: str = Field(max_length=64)


class LeaderRow(SQLModel, table=True):
    """Which replica runs the periodic jobs (`name`: "jobs"), and its fencing `epoch`: one more
    with each new leader, carried by the leader's writes so a deposed one cannot act. On
    PostgreSQL an advisory lock chooses the leader and this row records it; with
    GPUBOT_LEADER_LOCK=table the row itself is the lease, renewed before `expires_at`."""

    __tablename__ = "leader"

    name: str = Field(primary_key=True, max_length=32)
    holder: str = Field(default="", max_length=128)  # host:pid:token of the leader
    epoch: int = 0
    expires_at: datetime = _ts()
    renewed_at: datetime = _ts()
    # Where the other replicas reach this one's HTTP server (GPUBOT_ADVERTISE_URL): a follower
    # forwards the node agents' pushes to the leader's. "" when it serves no HTTP.
    address: str = Field(default="", max_length=256)


class MetricsCheckpointRow(SQLModel, table=True):
    """The /metrics history counters up to `upto` (requests filed and leases ended before it),
    written by the leader every few minutes so that a replica's first scrape adds only what
    came after, never the whole history. `totals` is storage.metrics.Totals as JSON."""

    __tablename__ = "metrics_checkpoint"

    id: int = Field(default=1, primary_key=True)
    upto: datetime = _ts()
    totals: dict[str, Any] = Field(
        default_factory=dict, sa_column=sa.Column(sa.JSON(), nullable=False)
    )
    written_at: datetime = _ts()


class SettingRow(SQLModel, table=True):
    """Runtime switches admins flip from Slack (the automation kill switch, drains)."""

    __tablename__ = "setting"

    key: str = Field(primary_key=True, max_length=64)
    value: str = Field(max_length=256)
    updated_at: datetime = _ts()
    updated_by: str = Field(max_length=64)


def utcnow() -> datetime:
    return datetime.now(UTC)


class OutboxRow(SQLModel, table=True):
    """A message owed to someone, written in the transaction of the decision that owes it.

    The delivery worker renders and sends it, records where it landed (channel, ts) and when,
    and retries with backoff while the chat service fails: nothing decided is ever unsaid.
    """

    __tablename__ = "outbox"
    __table_args__ = (
        # A lease's waiting redraw, an admin's open digest: read per sweep action, and the
        # `state` index alone would read every pending row (migration 0023).
        sa.Index("ix_outbox_subject_kind_state", "subject", "kind", "state"),
        sa.Index("ix_outbox_recipient_kind_state", "recipient", "kind", "state"),
    )

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = _ts(index=True)
    kind: str = Field(max_length=32)  # approval_card, card_settled, reply, home, ...
    subject: str = Field(max_length=64, index=True)  # request:12, lease:7
    recipient: str = Field(max_length=64)  # a channel id or a user id (a DM)
    data: dict[str, Any] = _json()
    # pending | sending | delivered | dropped | failed. sending: handed to Slack by the
    # deliverer `claimed_by` at `claimed_at`, outcome not recorded yet; dropped: nothing left
    # to say (e.g. the card was deleted); failed: given up after the attempt limit.
    state: str = Field(default="pending", max_length=16, index=True)
    attempts: int = 0
    next_attempt_at: datetime = _ts(index=True)
    last_error: str = Field(default="", max_length=500)
    claimed_at: datetime | None = _ts(nullable=True)
    claimed_by: str = Field(default="", max_length=32)
    delivered_at: datetime | None = _ts(nullable=True)
    channel: str | None = Field(default=None, max_length=32)  # where it landed
    ts: str | None = Field(default=None, max_length=32)
    # A message owed once per period (a digest): a second owe under the same key does nothing.
    dedupe_key: str | None = Field(default=None, max_length=128, unique=True, index=True)


class GpuMinuteRow(SQLModel, table=True):
    """One GPU's telemetry downsampled to one minute, for reports; pruned after the retention.

    `samples` counts every reading in the minute, `ok_samples` those whose NVML call worked;
    the utilisation and memory figures come from the ok ones (None when there were none).
    """

    __tablename__ = "gpu_minute"
    __table_args__ = (
        sa.UniqueConstraint("node", "index", "minute", name="uq_gpu_minute_node_index_minute"),
    )

    id: int | None = Field(default=None, primary_key=True)
    node: str = Field(max_length=128)
    index: int
    minute: datetime = _ts(index=True)
    util_avg_pct: float | None = None
    util_max_pct: float | None = None
    memory_used_max_mib: int | None = None
    samples: int = 0
    ok_samples: int = 0


#: The seconds an hourly row holds, which reports sum (and their covering indexes carry).
_SUMMED = ("allocated_s", "used_s", "busy_s", "idle_s", "unknown_s", "unreserved_s")


class GpuHourRow(SQLModel, table=True):
    """One GPU's use in one hour by one lease, rolled up from the per-minute history for reports.

    `lease_id` 0 is the time no lease held the GPU (written only when it was busy: unreserved
    use). Every `*_s` is seconds: `allocated_s` exactly from the lease's interval; `used_s`
    weighted by utilisation; `busy_s` and `idle_s` the observed minutes at or above and under
    the busy threshold; `unknown_s` allocated time without a working reading, never idle.
    """

    __tablename__ = "gpu_hour"
    __table_args__ = (
        sa.UniqueConstraint("hour", "node", "index", "lease_id", name="uq_gpu_hour"),
        # A team's window read from the index alone (migration 0017), in the order a report
        # of the team person by person groups it: hour, then pool and holder.
        sa.Index(
            "ix_gpu_hour_team_window",
            "team",
            "hour",
            "pool",
            "holder",
            "lease_id",
            *_SUMMED,
        ),
        sa.Index("ix_gpu_hour_holder_hour", "holder", "hour"),
        # A window read from the index alone (migration 0012): what reports group by and sum.
        sa.Index(
            "ix_gpu_hour_window",
            "hour",
            "pool",
            "team",
            "holder",
            "lease_id",
            *_SUMMED,
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    hour: datetime = _ts()  # no index of its own: the window index and uq_gpu_hour lead with it
    pool: str = Field(default="", max_length=64)
    node: str = Field(max_length=128)
    index: int
    team: str = Field(default="", max_length=64)
    holder: str = Field(default="", max_length=64)
    lease_id: int = 0
    allocated_s: float = 0.0
    used_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    unknown_s: float = 0.0
    unreserved_s: float = 0.0
    memory_peak_mib: int | None = None


class EnforcementRow(SQLModel, table=True):
    """An order to a node agent to signal a reclaimed lease's processes, and what came of it.

    Written pending in the reclaim's transaction; `sent` once an agent's push carried it away;
    `done` when the agent posted the results. `targets` are `{gpu, pid, started, user}`:
    the start time lets the agent refuse a PID that now belongs to another process.
    """

    __tablename__ = "enforcement"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = _ts()
    lease_id: int = Field(foreign_key="lease.id", index=True)
    node: str = Field(max_length=128)
    targets: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=sa.Column(sa.JSON(), nullable=False)
    )
    term_grace_s: int = 30
    dry_run: bool = False
    state: str = Field(default="pending", max_length=16)  # pending | sent | done
    sent_at: datetime | None = _ts(nullable=True)
    done_at: datetime | None = _ts(nullable=True)
    result: dict[str, Any] = _json()


class InboxRow(SQLModel, table=True):
    """A Slack request accepted and acknowledged, written before its ack: a worker carries it out
    once, in the same transaction that owes its answer and marks it done, whatever happens after.

    `key` is the request's idempotency key (Slack's event_id, else a hash of the signed body), so
    a retry or a replay of an acknowledged request is acknowledged again and never run twice.
    """

    __tablename__ = "inbox"

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(max_length=96, unique=True)
    received_at: datetime = _ts(index=True)
    kind: str = Field(
        max_length=32
    )  # command, action, view or event (the kinds bot.slack.inbox takes)
    actor: str = Field(max_length=32)  # the Slack user: their requests run in arrival order
    payload: dict[str, Any] = _json()
    # pending | done | failed (failed: gave up; the person was told with a reference)
    state: str = Field(default="pending", max_length=16, index=True)
    attempts: int = 0
    next_attempt_at: datetime = _ts()
    done_at: datetime | None = _ts(nullable=True)
    last_error: str = Field(default="", max_length=500)


class AgentNonceRow(SQLModel, table=True):
    """A nonce a node agent has spent, kept until its timestamp would be refused anyway, so a
    captured push cannot be replayed, not even across a restart of the bot."""

    __tablename__ = "agent_nonce"
    __table_args__ = (sa.UniqueConstraint("node", "nonce", name="uq_agent_nonce_node_nonce"),)

    id: int | None = Field(default=None, primary_key=True)
    node: str = Field(max_length=128)
    nonce: str = Field(max_length=128)
    expires_at: datetime = _ts(index=True)


#: `gpu.held` kept from `lease_gpu.active` by triggers, in the same statement as the change: a
#: GPU is held while a lease_gpu row of it is active (ix_lease_gpu_active: at most one).
#: Migrations create the same (0016).
HELD_TRIGGERS = {
    "sqlite": (
        "CREATE TRIGGER tr_lease_gpu_held_insert AFTER INSERT ON lease_gpu WHEN NEW.active "
        "BEGIN UPDATE gpu SET held = 1 WHERE id = NEW.gpu_id; END",
        "CREATE TRIGGER tr_lease_gpu_held_update AFTER UPDATE OF active, gpu_id ON lease_gpu "
        "BEGIN UPDATE gpu SET held = 0 WHERE id = OLD.gpu_id AND OLD.active; "
        "UPDATE gpu SET held = 1 WHERE id = NEW.gpu_id AND NEW.active; END",
        "CREATE TRIGGER tr_lease_gpu_held_delete AFTER DELETE ON lease_gpu WHEN OLD.active "
        "BEGIN UPDATE gpu SET held = 0 WHERE id = OLD.gpu_id; END",
    ),
    "postgresql": (
        "CREATE FUNCTION lease_gpu_held() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        "  IF TG_OP <> 'INSERT' THEN\n"
        "    IF OLD.active THEN UPDATE gpu SET held = false WHERE id = OLD.gpu_id; END IF;\n"
        "  END IF;\n"
        "  IF TG_OP <> 'DELETE' THEN\n"
        "    IF NEW.active THEN UPDATE gpu SET held = true WHERE id = NEW.gpu_id; END IF;\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END $$",
        "CREATE TRIGGER tr_lease_gpu_held AFTER INSERT OR UPDATE OF active, gpu_id OR DELETE "
        "ON lease_gpu FOR EACH ROW EXECUTE FUNCTION lease_gpu_held()",
    ),
}

for _dialect, _statements in HELD_TRIGGERS.items():
    for _statement in _statements:
        # create_all (tests, a new SQLite file) builds them with the table
        _ddl = sa.DDL(_statement).execute_if(dialect=_dialect)  # type: ignore[no-untyped-call]  # DDL has no annotations
        sa.event.listen(LeaseGpuRow.__table__, "after_create", _ddl)  # type: ignore[attr-defined]
