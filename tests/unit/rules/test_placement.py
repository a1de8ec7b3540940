"""Best-fit placement: one node when possible, the tightest fitting node, fewest nodes else."""

from __future__ import annotations

import pytest

from rules.placement import place


@pytest.mark.parametrize(
    ("free", "count", "expected"),
    [
        ({"a": [0, 1, 2, 3, 4, 5, 6, 7], "b": [6, 7]}, 2, [("b", 6), ("b", 7)]),
        ({"a": [0, 1, 2], "b": [0, 1, 2, 3, 4]}, 3, [("a", 0), ("a", 1), ("a", 2)]),
        ({"a": [5, 1, 3], "b": []}, 2, [("a", 1), ("a", 3)]),
        (
            {"a": [0, 1, 2], "b": [0, 1], "c": [4]},
            4,
            [("a", 0), ("a", 1), ("a", 2), ("c", 4)],
        ),
        (
            {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1]},
            6,
            [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("c", 0), ("c", 1)],
        ),
        ({"a": [0], "b": [0]}, 3, None),
        ({"a": [0, 1]}, 0, None),
    ],
)
def test_placement_prefers_one_node_and_the_tightest_fit(
    free: dict[str, list[int]], count: int, expected: list[tuple[str, int]] | None
) -> None:
    """Small requests fill the fullest node that fits; big holes stay whole."""
    assert expected == place(free, count)


@pytest.mark.parametrize(
    ("free", "unknown", "count", "expected"),
    [
        # The tightest node is unknown: a node vouched empty wins.
        ({"a": [0, 1], "b": [0, 1, 2]}, {("a", 0), ("a", 1)}, 2, [("b", 0), ("b", 1)]),
        # Within a node the known GPUs go first.
        ({"a": [0, 1, 2]}, {("a", 0)}, 2, [("a", 1), ("a", 2)]),
        # Only unknown GPUs fit: they are offered all the same.
        ({"a": [0], "b": [0, 1]}, {("b", 0), ("b", 1)}, 2, [("b", 0), ("b", 1)]),
        # Several nodes: each node's known GPUs before its unknown ones.
        ({"a": [0, 1], "b": [0, 1]}, {("a", 0)}, 3, [("a", 1), ("a", 0), ("b", 0)]),
    ],
)
def test_gpus_without_fresh_telemetry_are_placed_last(
    free: dict[str, list[int]],
    unknown: set[tuple[str, int]],
    count: int,
    expected: list[tuple[str, int]],
) -> None:
    assert expected == place(free, count, unknown)
