"""What the commands count without reading every lease: whether each GPU is held, and the
leases being recalled.

`gpu.held` says the GPU is in an active lease. Triggers on lease_gpu keep it in the statement
that changes `active` (storage.tables.HELD_TRIGGERS), and `gpu (pool, held, state, observed,
model, node_id)` replaces the index without it: `/gpu status` and placement count where the
GPUs stand from that index alone, not by asking the lease index of every GPU.

`ix_lease_recalled` is a partial index over the active leases whose marks hold a recall, by
pool and state (storage.tables.RECALLED_WHERE). Each borrow and release asks whether a recall
is under way in the pool, and `/gpu why R` which leases a request recalled: with it they read
those few leases instead of every active lease of the pool.

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
_RECALLED = {
    "sqlite": "state = 'active' AND json_extract(warnings, '$.recall') IS NOT NULL",
    "postgresql": "state = 'active' AND (warnings ->> 'recall') IS NOT NULL",
}
_TRIGGERS = {
    "sqlite": (
        "CREATE TRIGGER tr_lease_gpu_held_insert AFTER INSERT ON lease_gpu WHEN NEW.active "
        "BEGIN UPDATE gpu SET held = 1 WHERE id = NEW.gpu_id; END",
        "CREATE TRIGGER tr_lease_gpu_held_update AFTER UPDATE OF active, gpu_id ON lease_gpu "
        "BEGIN UPDATE gpu SET held = 0 WHERE id = OLD.gpu_id AND OLD.active; "
        "UPDATE gpu SET held = 1 WHERE id = NEW.gpu_id AND NEW.active; END",
        "CREATE TRIGGER tr_lease_gpu_held_delete AFTER DELETE ON lease_gpu WHEN OLD.active "
        "BEGIN UPDATE gpu SET held = 0 WHERE id = OLD.gpu_id; END",
    ),
    "postgresql": (
        "CREATE FUNCTION lease_gpu_held() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        "  IF TG_OP <> 'INSERT' THEN\n"
        "    IF OLD.active THEN UPDATE gpu SET held = false WHERE id = OLD.gpu_id; END IF;\n"
        "  END IF;\n"
        "  IF TG_OP <> 'DELETE' THEN\n"
        "    IF NEW.active THEN UPDATE gpu SET held = true WHERE id = NEW.gpu_id; END IF;\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END $$",
        "CREATE TRIGGER tr_lease_gpu_held AFTER INSERT OR UPDATE OF active, gpu_id OR DELETE "
        "ON lease_gpu FOR EACH ROW EXECUTE FUNCTION lease_gpu_held()",
    ),
}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    # a plain ALTER TABLE (SQLite adds a column with a constant default in place): a batch
    # would copy the table, which the lease GPUs referring to it forbid
    op.add_column("gpu", sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute("UPDATE gpu SET held = true WHERE id IN (SELECT gpu_id FROM lease_gpu WHERE active)")
    for statement in _TRIGGERS[dialect]:
        op.execute(statement)
    op.drop_index("ix_gpu_pool_state_observed_model", table_name="gpu")
    op.create_index(
        "ix_gpu_pool_held_state_observed_model",
        "gpu",
        ["pool", "held", "state", "observed", "model", "node_id"],
    )
    op.create_index(
        "ix_lease_recalled",
        "lease",
        ["pool", "state"],
        sqlite_where=sa.text(_RECALLED["sqlite"]),
        postgresql_where=sa.text(_RECALLED["postgresql"]),
    )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.drop_index("ix_lease_recalled", table_name="lease")
    op.drop_index("ix_gpu_pool_held_state_observed_model", table_name="gpu")
    op.create_index(
        "ix_gpu_pool_state_observed_model",
        "gpu",
        ["pool", "state", "observed", "model", "node_id"],
    )
    if dialect == "postgresql":
        op.execute("DROP TRIGGER tr_lease_gpu_held ON lease_gpu")
        op.execute("DROP FUNCTION lease_gpu_held()")
    else:
        for name in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER tr_lease_gpu_held_{name}")
    op.drop_column("gpu", "held")
