"""The /metrics checkpoint: the history counters up to a time, kept by the leader so a replica's
first scrape reads only what came after (storage.tables.MetricsCheckpointRow), and the index
that finds the leases ended since a time.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_lease_ended_at_state", "lease", ["ended_at", "state"])
    op.create_table(
        "metrics_checkpoint",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("upto", sa.DateTime(timezone=True), nullable=False),
        sa.Column("totals", sa.JSON(), nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("metrics_checkpoint")
    op.drop_index("ix_lease_ended_at_state", table_name="lease")
