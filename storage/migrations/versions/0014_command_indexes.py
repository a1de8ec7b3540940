"""Indexes the commands read through, so that a command's work grows with what it answers,
not with the fleet.

`lease (pool, state, team, gpus)` holds all a quota sum reads (the GPUs each team holds in a
pool), so the sum reads the index alone. `gpu (pool, state, observed, model, node_id)` holds
where each GPU stands apart from its lease and its node: `/gpu status` counts it by pool and
model, placement counts a pool's free GPUs per node and finds those in use without a lease,
without reading a GPU row.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_lease_pool_state_team_gpus", "lease", ["pool", "state", "team", "gpus"])
    op.create_index(
        "ix_gpu_pool_state_observed_model",
        "gpu",
        ["pool", "state", "observed", "model", "node_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_gpu_pool_state_observed_model", table_name="gpu")
    op.drop_index("ix_lease_pool_state_team_gpus", table_name="lease")
