"""Alembic revision scripts, one per schema change, applied in order by `storage.migrate`."""
