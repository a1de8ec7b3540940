"""The hourly rows' indexes for reports: a breakdown by lease and a team's month person by
person read their rows from an index alone, in the order they group them.

- a team's index covers what reports sum (team, hour, pool, holder, lease, the seconds),
  replacing the one on (team, hour) that sent every row's read to the table;
- the index on the hour alone goes: the window index and the unique key both lead with the
  hour and serve every read and delete it served, and each index costs the hourly rollup
  its inserts;
- on SQLite, an index by UTC day, then lease and pool: SQLite groups by sorting, and this
  yields each day's rows in lease order (storage.reports groups by lease day by day first).
  PostgreSQL groups by hashing and needs none. The models do not declare it: it indexes an
  expression only SQLite computes on these timestamps (stored there as text,
  `YYYY-MM-DD HH:MM:SS.ffffff`), and SQLAlchemy cannot reflect one to compare it.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None

SUMMED = ["allocated_s", "used_s", "busy_s", "idle_s", "unknown_s", "unreserved_s"]
LEASE_DAY = "ix_gpu_hour_lease_day"


def upgrade() -> None:
    op.drop_index("ix_gpu_hour_hour", table_name="gpu_hour")
    op.drop_index("ix_gpu_hour_team_hour", table_name="gpu_hour")
    op.create_index(
        "ix_gpu_hour_team_window",
        "gpu_hour",
        ["team", "hour", "pool", "holder", "lease_id", *SUMMED],
    )
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            f"CREATE INDEX {LEASE_DAY} ON gpu_hour "
            f"(substr(hour, 1, 10), lease_id, pool, hour, {', '.join(SUMMED)})"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"DROP INDEX {LEASE_DAY}")
    op.drop_index("ix_gpu_hour_team_window", table_name="gpu_hour")
    op.create_index("ix_gpu_hour_team_hour", "gpu_hour", ["team", "hour"])
    op.create_index("ix_gpu_hour_hour", "gpu_hour", ["hour"])
