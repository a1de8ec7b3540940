"""Indexes the scale measurements asked for, and the leader row of the replicas.

`request.lease_id` (`/gpu why L` finds the request of a lease) and `lease (end_reason,
ended_at)` (the recall cooldown: leases preempted since a time) were scans; /metrics counts
requests by `(pool, team, kind, outcome)` from an index that holds just those. `leader` records
which replica runs the periodic jobs, its fencing epoch and the address the other replicas
forward the node agents' pushes to (see storage.tables.LeaderRow).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_request_lease_id", "request", ["lease_id"])
    op.create_index("ix_lease_end_reason_ended_at", "lease", ["end_reason", "ended_at"])
    op.create_index(
        "ix_request_pool_team_kind_outcome", "request", ["pool", "team", "kind", "outcome"]
    )
    op.create_table(
        "leader",
        sa.Column("name", sa.String(length=32), primary_key=True),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("address", sa.String(length=256), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader")
    op.drop_index("ix_request_pool_team_kind_outcome", table_name="request")
    op.drop_index("ix_lease_end_reason_ended_at", table_name="lease")
    op.drop_index("ix_request_lease_id", table_name="request")
