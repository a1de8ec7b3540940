"""Indexes `/gpu status` reads through, so that its cost barely grows with the fleet.

`node (id) WHERE drained`: status (and a /metrics scrape) asks which nodes are drained on
every call, and without it read every node to learn that few or none are. Partial, on the
condition as each engine's query writes it (`drained = 1` on SQLite, which has no boolean
type, and `drained` on PostgreSQL), so that it holds the drained nodes only.

`gpu (pool, held)` in place of `gpu (pool)`: status counts most kinds of GPU (free or held, in
each pool) over a range of it, whose entries are a third the size of those of
ix_gpu_pool_held_state_observed_model, so that a read after any write reloads a third of the
pages. What read `gpu (pool)` reads its leading column.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index(
        "ix_node_drained",
        "node",
        ["id"],
        sqlite_where=sa.text("drained = 1"),
        postgresql_where=sa.text("drained"),
    )
    op.create_index("ix_gpu_pool_held", "gpu", ["pool", "held"])
    op.drop_index("ix_gpu_pool", table_name="gpu")


def downgrade() -> None:
    op.create_index("ix_gpu_pool", "gpu", ["pool"])
    op.drop_index("ix_gpu_pool_held", table_name="gpu")
    op.drop_index("ix_node_drained", table_name="node")
