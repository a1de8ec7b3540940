"""The outbox: messages owed, written with the decisions that owe them, and their delivery.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("recipient", sa.String(length=64), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.String(length=500), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("channel", sa.String(length=32), nullable=True),
        sa.Column("ts", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    for column in ("created_at", "subject", "state", "next_attempt_at"):
        op.create_index(f"ix_outbox_{column}", "outbox", [column])


def downgrade() -> None:
    for column in ("created_at", "subject", "state", "next_attempt_at"):
        op.drop_index(f"ix_outbox_{column}", table_name="outbox")
    op.drop_table("outbox")
