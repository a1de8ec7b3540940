"""Device state and history: what telemetry last showed on each GPU (empty, occupied, unknown,
not reporting), each GPU's and node's profile, and a log of lifecycle events per device.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.add_column(
            sa.Column("reporting", sa.String(length=16), nullable=False, server_default="unknown")
        )
        batch.add_column(sa.Column("reporting_since", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("driver", sa.String(length=32), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("cuda", sa.String(length=16), nullable=False, server_default=""))
    with op.batch_alter_table("gpu") as batch:
        batch.add_column(
            sa.Column("observed", sa.String(length=16), nullable=False, server_default="unknown")
        )
        batch.add_column(sa.Column("observed_since", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("occupants", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )
        batch.add_column(sa.Column("memory_used_mib", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("temperature_c", sa.Float(), nullable=True))
        batch.add_column(sa.Column("power_w", sa.Float(), nullable=True))
        batch.add_column(sa.Column("profiled_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "device_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_device_event_at", "device_event", ["at"])
    op.create_index("ix_device_event_node", "device_event", ["node"])


def downgrade() -> None:
    op.drop_index("ix_device_event_node", table_name="device_event")
    op.drop_index("ix_device_event_at", table_name="device_event")
    op.drop_table("device_event")
    with op.batch_alter_table("gpu") as batch:
        for name in (
            "profiled_at",
            "power_w",
            "temperature_c",
            "memory_used_mib",
            "occupants",
            "observed_since",
            "observed",
        ):
            batch.drop_column(name)
    with op.batch_alter_table("node") as batch:
        for name in ("cuda", "driver", "reporting_since", "reporting"):
            batch.drop_column(name)
