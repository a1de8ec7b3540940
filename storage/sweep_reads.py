"""The sweep's reads at fleet scale: every GPU as the sweep sees it, from plain columns.

`storage.gpus.gpu_lines` serves placement and status (where each GPU stands, who runs on it)
and decodes every GPU's occupants; the sweep needs neither, and at 100,000 GPUs that decoding
was the largest part of a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from operator import itemgetter
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Result
from sqlmodel import Session

from rules.lease_facts import GpuLine, GpuSnapshot
from storage.tables import GpuRow, LeaseGpuRow, NodeRow

_GPU = GpuRow.__table__  # type: ignore[attr-defined]
_NODE = NodeRow.__table__  # type: ignore[attr-defined]
_HELD = LeaseGpuRow.__table__  # type: ignore[attr-defined]
_first = itemgetter(0)
_T = TypeVar("_T")

Between = Callable[[], object]  # called between two chunks of a large read (bot.foreground)
ROWS = 1000  # rows converted between two calls of `between`: a few milliseconds


def fetched(result: Result[Any], between: Between | None = None) -> list[Any]:
    """Every row of `result`; with `between`, ROWS rows at a time with a call of `between`
    after each (the driver converts rows as they are fetched, so a request that waits on
    this process is let in between chunks, not after 100,000 rows)."""
    if between is None:
        return list(result.all())
    out: list[Any] = []
    for part in result.partitions(ROWS):
        out.extend(part)
        between()
    return out


def chunked(
    items: Iterable[_T], between: Between | None = None, size: int | None = None
) -> Iterator[_T]:
    """`items` in order, with a call of `between` after each `size` of them (ROWS)."""
    if between is None:
        yield from items
        return
    rest, size = iter(items), size or ROWS
    while chunk := list(islice(rest, size)):
        yield from chunk
        between()


def gpu_snapshots(session: Session) -> list[GpuSnapshot]:
    """Every GPU with its inventory state and active lease, by id (as storage.gpus has it)."""
    return [GpuSnapshot(*line) for line in gpu_lines(session)]


def gpu_lines(session: Session, between: Between | None = None) -> list[GpuLine]:
    """`gpu_snapshots` as plain tuples of the snapshot's fields: the sweep makes a snapshot
    object only of a GPU it acts on, not of each of 100,000. `between`: see `fetched`."""
    db = session.connection()
    # Written as the partial index's own predicate, so the engines read the active rows
    # through ix_lease_gpu_active rather than every lease-GPU row ever written.
    active = sa.select(_HELD.c.gpu_id, _HELD.c.lease_id).where(sa.text("lease_gpu.active"))
    held: dict[int, int] = dict(fetched(db.execute(active), between))
    rows = fetched(
        db.execute(
            sa.select(
                _GPU.c.id,
                _NODE.c.name,
                _GPU.c.index,
                _GPU.c.model,
                _GPU.c.pool,
                _GPU.c.state,
                _NODE.c.drained,
            ).join(_NODE, _NODE.c.id == _GPU.c.node_id),
        ),
        between,
    )  # in chunks of rows: row by row costs a cursor call per GPU
    # In id order, sorted here: the rows come (nearly) in that order already, which Python's
    # sort takes in one run, where PostgreSQL sorted every GPU after its hash join.
    rows = sorted(rows, key=_first)
    get = held.get
    return [
        (gpu_id, node, index, model, pool, state, bool(drained), get(gpu_id))
        for gpu_id, node, index, model, pool, state, drained in chunked(rows, between)
    ]
