"""Indexes the /metrics history counters read the whole history through, so that the first
scrape with no checkpoint yet reads index entries, not the lease, lease GPU and request rows.

`request (pool, team, kind, outcome, created_at)` replaces `(pool, team, kind, outcome)`: the
requests filed before a time, counted from the index alone. `lease (state, pool, team,
end_reason, ended_at, granted_at, gpus) WHERE ended_at IS NOT NULL` counts the reclaims by
reason and the GPU-seconds of the ended leases.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index(
        "ix_request_pool_team_kind_outcome_created",
        "request",
        ["pool", "team", "kind", "outcome", "created_at"],
    )
    op.drop_index("ix_request_pool_team_kind_outcome", table_name="request")
    op.create_index(
        "ix_lease_ended_state_team",
        "lease",
        ["state", "pool", "team", "end_reason", "ended_at", "granted_at", "gpus"],
        sqlite_where=sa.text("ended_at IS NOT NULL"),
        postgresql_where=sa.text("ended_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_lease_ended_state_team", table_name="lease")
    op.create_index(
        "ix_request_pool_team_kind_outcome", "request", ["pool", "team", "kind", "outcome"]
    )
    op.drop_index("ix_request_pool_team_kind_outcome_created", table_name="request")
