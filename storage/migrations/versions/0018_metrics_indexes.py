"""Indexes a /metrics scrape reads through, so that it reads no GPU or lease row at 100,000
GPUs.

`gpu (node_id, profiled_at)` gives each node's newest telemetry in one probe. `lease (state,
team, pool, granted_at, gpus) WHERE state = 'active'` holds all that the active leases' GPUs and
GPU-seconds so far need; partial, so that it stays small and no count over the history
prefers it to the indexes that suit such a count.
`lease_gpu (lease_id) WHERE released_at IS NOT NULL` finds the few GPUs a shrink gave back.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_gpu_node_profiled", "gpu", ["node_id", "profiled_at"])
    op.create_index(
        "ix_lease_active_team_pool_granted",
        "lease",
        ["state", "team", "pool", "granted_at", "gpus"],
        sqlite_where=sa.text("state = 'active'"),
        postgresql_where=sa.text("state = 'active'"),
    )
    op.create_index(
        "ix_lease_gpu_given_back",
        "lease_gpu",
        ["lease_id"],
        sqlite_where=sa.text("released_at IS NOT NULL"),
        postgresql_where=sa.text("released_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_lease_gpu_given_back", table_name="lease_gpu")
    op.drop_index("ix_lease_active_team_pool_granted", table_name="lease")
    op.drop_index("ix_gpu_node_profiled", table_name="gpu")
