"""An index for fair share: a pool's active leases, and those that ended since an instant,
read from the index alone (team, GPUs and grant time beside the end), not through the pool's
whole history.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index(
        "ix_lease_pool_state_ended",
        "lease",
        ["pool", "state", "ended_at", "team", "gpus", "granted_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_lease_pool_state_ended", table_name="lease")
