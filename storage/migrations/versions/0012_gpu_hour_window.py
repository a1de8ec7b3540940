"""A covering index for reports over a window of hourly rows: the hour first, then what a lab or
pool report groups by and sums, so the database reads a window from the index alone and a
per-hour (per-day) breakdown comes out in index order, without sorting.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = [
    "hour",
    "pool",
    "team",
    "holder",
    "lease_id",
    "allocated_s",
    "used_s",
    "busy_s",
    "idle_s",
    "unknown_s",
    "unreserved_s",
]


def upgrade() -> None:
    op.create_index("ix_gpu_hour_window", "gpu_hour", COLUMNS)


def downgrade() -> None:
    op.drop_index("ix_gpu_hour_window", table_name="gpu_hour")
