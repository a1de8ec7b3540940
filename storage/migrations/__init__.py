"""Alembic migrations for gpubot's schema; run them through `storage.migrate`, not alembic.ini."""
