"""An index for the queue's timeline: a pool's active leases in order of expiry, read only as
far as backfill looks, not all of a large pool's thousands.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_lease_pool_state_expires", "lease", ["pool", "state", "expires_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_lease_pool_state_expires", table_name="lease")
