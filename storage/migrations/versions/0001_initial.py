"""The initial schema: pools, nodes, GPUs, requests, approvals, leases, the audit chain, settings.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    # storage.tables.UtcDateTime stores exactly this; the migration must not import the models.
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _str(name: str, length: int, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.String(length=length), nullable=nullable)


def _int(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.Integer(), nullable=nullable)


def _bool(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.Boolean(), nullable=False)


def _json(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.JSON(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "pool",
        _str("name", 64),
        _str("model", 128),
        _bool("protected"),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "node",
        _int("id"),
        _str("name", 128),
        _str("pool", 64),
        _bool("drained"),
        sa.ForeignKeyConstraint(["pool"], ["pool.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_index("ix_node_pool", "node", ["pool"])

    op.create_table(
        "gpu",
        _int("id"),
        _int("node_id"),
        _int("index"),
        _str("uuid", 96, nullable=True),
        _str("model", 128),
        _int("memory_mib"),
        _str("pool", 64),
        _str("state", 16),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"]),
        sa.ForeignKeyConstraint(["pool"], ["pool.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node_id", "index", name="uq_gpu_node_index"),
        sa.UniqueConstraint("uuid"),
    )
    op.create_index("ix_gpu_node_id", "gpu", ["node_id"])
    op.create_index("ix_gpu_pool", "gpu", ["pool"])

    op.create_table(
        "lease",
        _int("id"),
        _str("holder", 64),
        _str("team", 64),
        _str("pool", 64),
        _int("gpus"),
        _str("priority", 16),
        _bool("protected"),
        _str("reason", 2000),
        _str("state", 16),
        _ts("granted_at"),
        _ts("expires_at"),
        _ts("ended_at", nullable=True),
        _str("end_reason", 64),
        _int("extensions"),
        _int("extended_s"),
        _json("warnings"),
        _int("snoozes"),
        _ts("snoozed_until", nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    for column in ("expires_at", "holder", "pool", "state", "team"):
        op.create_index(f"ix_lease_{column}", "lease", [column])

    op.create_table(
        "lease_gpu",
        _int("lease_id"),
        _int("gpu_id"),
        _bool("active"),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpu.id"]),
        sa.ForeignKeyConstraint(["lease_id"], ["lease.id"]),
        sa.PrimaryKeyConstraint("lease_id", "gpu_id"),
    )
    # Invariant 1: no GPU in two active leases, refused by the database itself.
    op.create_index(
        "ix_lease_gpu_active",
        "lease_gpu",
        ["gpu_id"],
        unique=True,
        sqlite_where=sa.text("active"),
        postgresql_where=sa.text("active"),
    )

    op.create_table(
        "request",
        _int("id"),
        _str("kind", 16),
        _str("requester", 64),
        _str("team", 64),
        _str("pool", 64),
        _int("gpus"),
        _int("duration_s"),
        _str("priority", 16),
        _str("reason", 2000),
        _str("state", 16),
        _str("outcome", 16),
        _json("approvers"),
        _str("approval_route", 128),
        _int("lease_id", nullable=True),
        _int("audit_id", nullable=True),
        _ts("created_at"),
        _ts("decided_at", nullable=True),
        _str("decided_by", 64, nullable=True),
        sa.ForeignKeyConstraint(["lease_id"], ["lease.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    for column in ("created_at", "pool", "requester", "state", "team"):
        op.create_index(f"ix_request_{column}", "request", [column])

    op.create_table(
        "approval",
        _int("id"),
        _int("request_id"),
        _str("approver", 64),
        _str("verdict", 16),
        _str("reason", 2000),
        _ts("at"),
        sa.ForeignKeyConstraint(["request_id"], ["request.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("request_id"),
    )

    op.create_table(
        "audit",
        _int("id"),
        _ts("at"),
        _str("actor", 64),
        _str("tag", 64),
        _str("subject", 64),
        _str("outcome", 32),
        _str("deciding_rule", 128),
        _json("matching_rules"),
        _json("facts"),
        _json("detail"),
        _str("revision", 80),
        _str("engine", 16),
        _str("prev_hash", 64),
        _str("hash", 64),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("hash"),
    )
    for column in ("at", "subject", "tag"):
        op.create_index(f"ix_audit_{column}", "audit", [column])

    op.create_table(
        "audit_head",
        _int("id"),
        _int("last_id"),
        _str("last_hash", 64),
        sa.PrimaryKeyConstraint("id"),
    )

    op.create_table(
        "setting",
        _str("key", 64),
        _str("value", 256),
        _ts("updated_at"),
        _str("updated_by", 64),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    # Children before parents; a table's indexes go with it.
    for table in (
        "setting",
        "audit_head",
        "audit",
        "approval",
        "request",
        "lease_gpu",
        "lease",
        "gpu",
        "node",
        "pool",
    ):
        op.drop_table(table)
