"""Hourly GPU use per lease, rolled up from the per-minute history, for reports.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_hour",
        sa.Column("id", sa.Integer(), nullable=False),
        # storage.tables.UtcDateTime stores exactly this; the migration must not import the models.
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("lease_id", sa.Integer(), nullable=False),
        sa.Column("allocated_s", sa.Float(), nullable=False),
        sa.Column("used_s", sa.Float(), nullable=False),
        sa.Column("busy_s", sa.Float(), nullable=False),
        sa.Column("idle_s", sa.Float(), nullable=False),
        sa.Column("unknown_s", sa.Float(), nullable=False),
        sa.Column("unreserved_s", sa.Float(), nullable=False),
        sa.Column("memory_peak_mib", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("hour", "node", "index", "lease_id", name="uq_gpu_hour"),
    )
    # Reports read a window of hours, for the lab, one team or one person.
    op.create_index("ix_gpu_hour_hour", "gpu_hour", ["hour"])
    op.create_index("ix_gpu_hour_team_hour", "gpu_hour", ["team", "hour"])
    op.create_index("ix_gpu_hour_holder_hour", "gpu_hour", ["holder", "hour"])


def downgrade() -> None:
    op.drop_index("ix_gpu_hour_holder_hour", table_name="gpu_hour")
    op.drop_index("ix_gpu_hour_team_hour", table_name="gpu_hour")
    op.drop_index("ix_gpu_hour_hour", table_name="gpu_hour")
    op.drop_table("gpu_hour")
