"""Enforcement orders: what the `signal` enforcer asks a node agent to do, and the results.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "enforcement",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("targets", sa.JSON(), nullable=False),
        sa.Column("term_grace_s", sa.Integer(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["lease_id"], ["lease.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_enforcement_lease_id", "enforcement", ["lease_id"])


def downgrade() -> None:
    op.drop_index("ix_enforcement_lease_id", table_name="enforcement")
    op.drop_table("enforcement")
