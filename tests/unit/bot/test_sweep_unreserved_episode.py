"""Unreserved use is told once per episode: the sweep forgets a GPU it told of once the GPU
shows no unreserved use, and tells anew when the use comes back."""

from __future__ import annotations

from datetime import timedelta

from storage import keyvalue
from tests.bench import scale
from tests.bench.sweep import NOW, Slot, a_sample


def told(f: scale.Fleet) -> dict[str, frozenset[str]]:
    with f.services.db.read() as session:
        return keyvalue.told_unreserved(session)


def test_an_episode_ends_when_the_gpu_shows_no_unreserved_use_and_a_new_one_is_told() -> None:
    with scale.fleet("sqlite", 200, None) as f:
        f.services.sweep(f.telemetry)
        first = told(f)
        assert first  # the fleet's mix has unreserved processes on free GPUs
        key = sorted(first)[0]
        slot = next(s for s in f.slots if keyvalue.unreserved_key(s.node.name, s.index) == key)
        later = NOW + timedelta(seconds=1)
        f.telemetry.observe([a_sample(Slot(slot.node, slot.index, None), later, 0.0, None)])
        f.services.sweep(f.telemetry)
        assert key not in told(f)
        assert set(first) - {key} <= set(told(f))  # the others' episodes go on
        again = NOW + timedelta(seconds=2)
        f.telemetry.observe([a_sample(Slot(slot.node, slot.index, None), again, 50.0, "zed")])
        report = f.services.sweep(f.telemetry)
        assert f"{slot.node.name}:{slot.index} unreserved" in report.notified
        assert key in told(f)
