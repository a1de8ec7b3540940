"""The sweep's reads at fleet scale: every GPU as the sweep sees it, from plain columns.

`storage.gpus.gpu_lines` serves placement and status (where each GPU stands, who runs on it)
and decodes every GPU's occupants; the sweep needs neither, and at 100,000 GPUs that decoding
was the largest part of a pass.
"""

from __future__ import annotations

from operator import itemgetter

import sqlalchemy as sa
from sqlmodel import Session

from rules.lease_facts import GpuLine, GpuSnapshot
from storage.tables import GpuRow, LeaseGpuRow, NodeRow

_GPU = GpuRow.__table__  # type: ignore[attr-defined]
_NODE = NodeRow.__table__  # type: ignore[attr-defined]
_HELD = LeaseGpuRow.__table__  # type: ignore[attr-defined]
_first = itemgetter(0)


def gpu_snapshots(session: Session) -> list[GpuSnapshot]:
    """Every GPU with its inventory state and active lease, by id (as storage.gpus has it)."""
    return [GpuSnapshot(*line) for line in gpu_lines(session)]


def gpu_lines(session: Session) -> list[GpuLine]:
    """`gpu_snapshots` as plain tuples of the snapshot's fields: the sweep makes a snapshot
    object only of a GPU it acts on, not of each of 100,000."""
    db = session.connection()
    # Written as the partial index's own predicate, so the engines read the active rows
    # through ix_lease_gpu_active rather than every lease-GPU row ever written.
    active = sa.select(_HELD.c.gpu_id, _HELD.c.lease_id).where(sa.text("lease_gpu.active"))
    held: dict[int, int] = dict(db.execute(active).all())
    rows = db.execute(
        sa.select(
            _GPU.c.id,
            _NODE.c.name,
            _GPU.c.index,
            _GPU.c.model,
            _GPU.c.pool,
            _GPU.c.state,
            _NODE.c.drained,
        ).join(_NODE, _NODE.c.id == _GPU.c.node_id)
    ).all()  # fetched at once: row by row costs a cursor call per GPU
    # In id order, sorted here: the rows come (nearly) in that order already, which Python's
    # sort takes in one run, where PostgreSQL sorted every GPU after its hash join.
    rows = sorted(rows, key=_first)
    get = held.get
    return [
        (gpu_id, node, index, model, pool, state, bool(drained), get(gpu_id))
        for gpu_id, node, index, model, pool, state, drained in rows
    ]
