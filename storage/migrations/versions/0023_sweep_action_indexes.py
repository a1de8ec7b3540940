"""Indexes the sweep's actions read through, so that each action costs the same whatever the
fleet's size and however many messages the pass has owed so far.

`outbox (subject, kind, state)`: whether a lease's grant DM already has a redraw waiting (each
warning asks). `outbox (recipient, kind, state)`: an admin's digest still open for more lines.
Both were read through the `state` index, every pending row, and a first pass owes thousands.
`lease_gpu (gpu_id)`: the leases that held or gave back a GPU in unreserved use, which were
found by reading every active or every reclaimed lease.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_outbox_subject_kind_state", "outbox", ["subject", "kind", "state"])
    op.create_index("ix_outbox_recipient_kind_state", "outbox", ["recipient", "kind", "state"])
    op.create_index("ix_lease_gpu_gpu_id", "lease_gpu", ["gpu_id"])


def downgrade() -> None:
    op.drop_index("ix_lease_gpu_gpu_id", table_name="lease_gpu")
    op.drop_index("ix_outbox_recipient_kind_state", table_name="outbox")
    op.drop_index("ix_outbox_subject_kind_state", table_name="outbox")
