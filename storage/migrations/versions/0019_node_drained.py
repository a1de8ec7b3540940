"""The drained nodes found through their own index: `/gpu status` (and a /metrics scrape) asks
which nodes are drained on every call, and without it read every node to learn that few or
none are.

Partial, on the condition as each engine's query writes it (`drained = 1` on SQLite, which has
no boolean type, and `drained` on PostgreSQL), so that it holds the drained nodes only.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index(
        "ix_node_drained",
        "node",
        ["id"],
        sqlite_where=sa.text("drained = 1"),
        postgresql_where=sa.text("drained"),
    )


def downgrade() -> None:
    op.drop_index("ix_node_drained", table_name="node")
