"""Benchmark: reading DCGM exporters. Parsing one node's recorded /metrics (fixtures/dcgm) with
`read_exposition` (each label set parsed once, then kept between scrapes) against
prometheus_client's parser line by line, the reference; then one `DcgmSource.poll` of 500 nodes
served from one loopback server in this process (so the server's work is counted too).

Run with `python -m tests.bench.dcgm`. Reports figures; never fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from bot.telemetry.dcgm import DcgmSource, read_exposition
from tests.unit.telemetry.loopback import DCGM, recorded

FIXTURES = ("a100-node-01.prom", "h100-node-01-mig.prom")
NODES = 500


def per_call_ms(call: Callable[[], object], seconds: float = 1.0) -> float:
    """The median of five runs of as many calls as fit in `seconds` / 5."""
    runs = []
    for _ in range(5):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 5:
            call()
            count += 1
        runs.append((time.perf_counter() - start) / count * 1000)
    return sorted(runs)[2]


def parse_figures(name: str) -> str:
    text = (DCGM / name).read_text()
    known: dict[str, Mapping[str, str]] = {}
    read_exposition(text, known)
    reference = per_call_ms(lambda: list(text_string_to_metric_families(text)))
    first = per_call_ms(lambda: read_exposition(text))
    steady = per_call_ms(lambda: read_exposition(text, known))
    return f"{name:<24} {reference:>12.2f} {first:>9.2f} {steady:>8.3f} {reference / steady:>5.0f}x"


def poll_figure() -> None:
    with recorded() as server:
        for k in range(NODES):
            server.record(f"/n{k}/metrics", "a100-node-01.prom")
        source = DcgmSource({f"node-{k:04d}": server.url(f"/n{k}/metrics") for k in range(NODES)})
        try:
            for label in ("first", "next"):
                start = time.perf_counter()
                samples = source.poll(datetime.now(UTC))
                took = time.perf_counter() - start
                bad = sum(s.error is not None for s in samples)
                gpus = len(samples)
                print(
                    f"poll of {NODES} exporters ({label}): {took:.2f} s, {gpus} GPUs, {bad} unknown"
                )
        finally:
            source.close()


if __name__ == "__main__":
    logging.getLogger("bot.telemetry").setLevel(logging.ERROR)  # every node is named "node-k"
    print(f"{'recording':<24} {'reference ms':>12} {'first ms':>9} {'next ms':>8} {'ratio':>6}")
    for fixture in FIXTURES:
        print(parse_figures(fixture))
    poll_figure()
