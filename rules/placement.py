"""Best-fit placement of a lease's GPUs: one node when any fits, fewest nodes otherwise."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def place(
    free: Mapping[str, Sequence[int]],
    count: int,
    unknown: Collection[tuple[str, int]] = frozenset(),
) -> list[tuple[str, int]] | None:
    """Choose `count` GPUs from {node: free GPU indices}; None when there are not enough.

    One node: the one with the fewest free GPUs that still fits, so big holes stay whole for
    big requests. Several nodes: the fullest nodes first, then the tightest fit for the rest.
    GPUs in `unknown` (no fresh telemetry to vouch that they are empty) are taken last: on one
    node, the node needing the fewest of them wins; within a node, they come after the others.
    """
    if count <= 0 or sum(len(v) for v in free.values()) < count:
        return None

    def ordered(node: str) -> list[int]:
        return sorted(free[node], key=lambda i: ((node, i) in unknown, i))

    def unsure(node: str) -> int:
        return sum((node, i) in unknown for i in ordered(node)[:count])

    fits = [n for n in free if len(free[n]) >= count]
    if fits:
        node = min(fits, key=lambda n: (unsure(n), len(free[n]), n))
        return [(node, i) for i in ordered(node)[:count]]
    chosen: list[tuple[str, int]] = []
    remaining = sorted(free, key=lambda n: (-len(free[n]), n))
    while count > 0:
        fit = next((n for n in reversed(remaining) if len(free[n]) >= count), None)
        node = fit or remaining[0]
        take = ordered(node)[: min(count, len(free[node]))]
        chosen += [(node, i) for i in take]
        count -= len(take)
        remaining.remove(node)
    return chosen
