"""The request a requester filed with *Ask again* after theirs expired, so a second click
answers with it instead of filing another.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("request") as batch:
        batch.add_column(sa.Column("asked_again_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request") as batch:
        batch.drop_column("asked_again_id")
