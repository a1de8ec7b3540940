"""The durable inbox of acknowledged Slack requests, the agents' spent nonces, and who claimed
an outbox row for sending (so a restart knows which sends are in doubt).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "inbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=96), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    op.create_index("ix_inbox_received_at", "inbox", ["received_at"])
    op.create_index("ix_inbox_state", "inbox", ["state"])
    op.create_table(
        "agent_nonce",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("nonce", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "nonce", name="uq_agent_nonce_node_nonce"),
    )
    op.create_index("ix_agent_nonce_expires_at", "agent_nonce", ["expires_at"])
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("claimed_by", sa.String(length=32), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("claimed_by")
        batch.drop_column("claimed_at")
    op.drop_index("ix_agent_nonce_expires_at", table_name="agent_nonce")
    op.drop_table("agent_nonce")
    op.drop_index("ix_inbox_state", table_name="inbox")
    op.drop_index("ix_inbox_received_at", table_name="inbox")
    op.drop_table("inbox")
