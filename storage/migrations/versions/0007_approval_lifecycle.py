"""The approval lifecycle: how often a waiting request was reminded about, when last, when it
was escalated, when its requester last nudged the approvers, and when the holder was told an
extension still waits before the lease ends.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_WHEN = ("reminded_at", "escalated_at", "nudged_at", "told_at")


def upgrade() -> None:
    with op.batch_alter_table("request") as batch:
        batch.add_column(sa.Column("reminders", sa.Integer(), nullable=False, server_default="0"))
        for name in _WHEN:
            batch.add_column(sa.Column(name, sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request") as batch:
        for name in reversed(_WHEN):
            batch.drop_column(name)
        batch.drop_column("reminders")
