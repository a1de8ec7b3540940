"""The sweep lets the pushes being served go first (bot.foreground): between chunks of its
reads of the whole fleet, between chunks of the subjects it decides, and before each subject
it acts on (an action writes, and a chunk of them took seconds)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

import bot.services.sweep as sweep_module
from bot import foreground
from bot.services.sweep_gpus import act_on_gpu
from storage import sweep_reads
from tests.bench import scale


def test_a_pass_gives_way_in_its_reads_and_before_each_action(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []

    def given() -> None:
        reading = {"gpu_lines", "active_snapshots"} & _callers()
        events.append("read" if reading else "gave way")

    def acting(name: str, act: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any) -> Any:
            events.append(name)
            return act(*args)

        return recorded

    with scale.fleet("sqlite", 200, None) as f:
        monkeypatch.setattr(sweep_reads, "ROWS", 50)
        monkeypatch.setattr(foreground, "give_way", given)
        monkeypatch.setattr(sweep_module, "act_on_gpu", acting("gpu", act_on_gpu))
        monkeypatch.setattr(
            sweep_module, "_act_on_lease", acting("lease", sweep_module._act_on_lease)
        )
        report = f.services.sweep(f.telemetry)
    # 200 GPU lines (and the held ones) 50 at a time, then the leases'
    assert events.count("read") >= 8
    assert events.index("read") < events.index("gave way")
    acted = [k for k, event in enumerate(events) if event in ("gpu", "lease")]
    assert len(acted) >= 10, report  # the fleet's mix has leases and GPUs to act on
    assert all(events[k - 1] == "gave way" for k in acted)


def _callers() -> set[str]:
    frame, names = sys._getframe(2), set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    return names


@pytest.mark.parametrize(("count", "size", "calls"), [(0, 3, 0), (5, 3, 2), (6, 3, 2), (7, 3, 3)])
def test_chunked_gives_way_after_each_chunk(count: int, size: int, calls: int) -> None:
    seen: list[object] = []
    got = [
        (item, len(seen))
        for item in sweep_reads.chunked(range(count), lambda: seen.append(1), size)
    ]
    assert [item for item, _ in got] == list(range(count))
    assert len(seen) == calls
    # each item comes before the give-way that ends its chunk
    assert [before for _, before in got] == [k // size for k in range(count)]
    assert list(sweep_reads.chunked(range(count), None, size)) == list(range(count))
