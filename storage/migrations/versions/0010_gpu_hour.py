"""The hourly usage table (gpu_hour), filled by the rollup job from gpu_minute and the leases.

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
        sa.UniqueConstraint("hour", "node", "index", "lease_id", name="uq_gpu_hour_gpu_lease"),
    )


def downgrade() -> None:
    op.drop_table("gpu_hour")
