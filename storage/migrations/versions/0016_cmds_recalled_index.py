"""The index of the leases being recalled: a partial index over the active leases whose marks
hold a recall, by pool and state (storage.tables.RECALLED_WHERE). Each borrow and release asks
whether a recall is under way in the pool, and `/gpu why R` which leases a request recalled:
with it they read those few leases instead of every active lease of the pool.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None

# Written out here, not imported: a migration keeps the schema of its own day.
_WHERE = {
    "sqlite": "state = 'active' AND json_extract(warnings, '$.recall') IS NOT NULL",
    "postgresql": "state = 'active' AND (warnings ->> 'recall') IS NOT NULL",
}


def upgrade() -> None:
    op.create_index(
        "ix_lease_recalled",
        "lease",
        ["pool", "state"],
        sqlite_where=sa.text(_WHERE["sqlite"]),
        postgresql_where=sa.text(_WHERE["postgresql"]),
    )


def downgrade() -> None:
    op.drop_index("ix_lease_recalled", table_name="lease")
