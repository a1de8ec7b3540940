"""A key on outbox rows owed once per period (the digests): a unique index, so a second owe
under the same key, even from a racing process, adds nothing.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("dedupe_key", sa.String(length=128), nullable=True))
    op.create_index("ix_outbox_dedupe_key", "outbox", ["dedupe_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_outbox_dedupe_key", table_name="outbox")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("dedupe_key")
