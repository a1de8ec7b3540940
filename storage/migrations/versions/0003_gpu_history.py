"""GPU history: telemetry downsampled to one row per GPU per minute, for reports and retention.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_minute",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        # storage.tables.UtcDateTime stores exactly this; the migration must not import the models.
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("util_avg_pct", sa.Float(), nullable=True),
        sa.Column("util_max_pct", sa.Float(), nullable=True),
        sa.Column("memory_used_max_mib", sa.Integer(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("ok_samples", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "index", "minute", name="uq_gpu_minute_node_index_minute"),
    )
    # Retention deletes by minute; reports read one node's minutes in a range (the unique index).
    op.create_index("ix_gpu_minute_minute", "gpu_minute", ["minute"])


def downgrade() -> None:
    op.drop_index("ix_gpu_minute_minute", table_name="gpu_minute")
    op.drop_table("gpu_minute")
