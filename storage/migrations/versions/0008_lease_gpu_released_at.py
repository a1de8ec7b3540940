"""When a lease gave a GPU back while it ran on (a shrink): an ended lease shows the GPUs it
held at its end, and a GPU's history shows the lease only until the GPU went back.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("lease_gpu") as batch:
        batch.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lease_gpu") as batch:
        batch.drop_column("released_at")
