"""Best-fit placement of a lease's GPUs: one node when any fits, fewest nodes otherwise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def place(free: Mapping[str, Sequence[int]], count: int) -> list[tuple[str, int]] | None:
    """Choose `count` GPUs from {node: free GPU indices}; None when there are not enough.

    One node: the one with the fewest free GPUs that still fits, so big holes stay whole for
    big requests. Several nodes: the fullest nodes first, then the tightest fit for the rest.
    """
    if count <= 0 or sum(len(v) for v in free.values()) < count:
        return None
    nodes = sorted(free, key=lambda n: (len(free[n]), n))
    for node in nodes:
        if len(free[node]) >= count:
            return [(node, i) for i in sorted(free[node])[:count]]
    chosen: list[tuple[str, int]] = []
    remaining = sorted(nodes, key=lambda n: (-len(free[n]), n))
    while count > 0:
        fit = next((n for n in reversed(remaining) if len(free[n]) >= count), None)
        node = fit or remaining[0]
        take = sorted(free[node])[: min(count, len(free[node]))]
        chosen += [(node, i) for i in take]
        count -= len(take)
        remaining.remove(node)
    return chosen
