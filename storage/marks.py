"""The column type of a lease's marks: `rules.marks.Marks` in Python, the same JSON object as
ever in the database (no migration; the same on SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

from rules.marks import Marks


class MarksJSON(TypeDecorator[Marks]):
    """Stores `Marks` as the JSON object it wraps; reads it back as `Marks`. A plain mapping
    is stored as it is (bulk inserts write `{}`)."""

    impl = sa.JSON
    cache_ok = True

    def process_bind_param(
        self, value: Marks | Mapping[str, Any] | None, dialect: sa.Dialect
    ) -> dict[str, Any] | None:
        if value is None:
            return None
        return Marks.of(value).to_json()

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Marks:
        return Marks.of(value if isinstance(value, Mapping) else None)
