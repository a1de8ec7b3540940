"""/metrics as text: the exposition format every Prometheus server reads, written by
prometheus_client, except for the families of many plain samples, written here in one pass."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

#: The text exposition format every Prometheus server reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_MANY = 200  # samples from which a family takes the quick way


def scrape(registry: CollectorRegistry) -> bytes:
    """The registry's figures in the text exposition format (CONTENT_TYPE).

    A family of many plain samples (a telemetry age per node: 12,500 of them at 100,000 GPUs)
    is written here, the same bytes prometheus_client writes at a fraction of its cost; the
    others are written by prometheus_client."""
    out = []
    for metric in registry.collect():
        if isinstance(metric, ManySamples):
            out.append(metric.text())
            continue
        quick = None
        if metric.type in ("gauge", "counter") and len(metric.samples) > _MANY:
            quick = _plain_family(metric)
        out.append(quick if quick is not None else generate_latest(_Only(metric)))
    return b"".join(out)


class ManySamples(Metric):
    """A gauge or counter family of many plain samples, kept as (label values, value) pairs
    and written to text in one pass: no dict and no Sample per sample, which at 12,500 nodes
    cost more than the database's answer. prometheus_client's own writer still reads it
    (through `samples`), to the same bytes."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], *, typ: str = "gauge"
    ) -> None:
        super().__init__(name, documentation, typ)
        self.labels = tuple(labels)
        self.pairs: list[tuple[tuple[str, ...], float]] = []

    def add_metric(self, values: Sequence[str], value: float) -> None:
        self.pairs.append((tuple(values), float(value)))

    @property  # Metric keeps a plain list; the pairs are turned into one on demand
    def samples(self) -> list[Sample]:
        name = self._sample_name()
        return [Sample(name, dict(zip(self.labels, v, strict=True)), x) for v, x in self.pairs]

    @samples.setter
    def samples(self, _: list[Sample]) -> None:
        # Metric.__init__ sets an empty list; the pairs are the samples here.
        pass

    def _sample_name(self) -> str:
        return self.name + ("_total" if self.type == "counter" else "")

    def text(self) -> bytes:
        return _written(self._sample_name(), self.documentation, self.type, self.labels, self.pairs)


class _Only:
    """One collected family, as a collector prometheus_client can write."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


def _plain_family(metric: Metric) -> bytes | None:
    """A gauge or counter family of plain samples, as generate_latest writes it (None: it has
    more than plain samples)."""
    name = metric.name + ("_total" if metric.type == "counter" else "")
    if any(s.name != name or s.timestamp is not None or s.exemplar for s in metric.samples):
        return None
    keys = {k for s in metric.samples for k in s.labels}
    if any(s.labels.keys() != keys for s in metric.samples):
        return None  # not one label set: written by prometheus_client
    names = sorted(keys)
    pairs = [(tuple(s.labels[k] for k in names), s.value) for s in metric.samples]
    return _written(name, metric.documentation, metric.type, names, pairs)


def _written(
    name: str,
    documentation: str,
    typ: str,
    labels: Sequence[str],
    pairs: Iterable[tuple[tuple[str, ...], Any]],
) -> bytes:
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n"]
    order = sorted(range(len(labels)), key=lambda i: labels[i])  # as generate_latest sorts
    heads = [f'{labels[i]}="' for i in order]
    seen: dict[str, str] = {}  # a pool's name repeats on every node: escaped once
    for values, value in pairs:
        parts = []
        for head, i in zip(heads, order, strict=True):
            raw = values[i]
            text = seen.get(raw)
            if text is None:
                text = _escaped(raw)
                if len(seen) < 1000:
                    seen[raw] = text
            parts.append(head + text + '"')
        line = f"{name}{{{','.join(parts)}}}" if parts else name
        lines.append(f"{line} {_number(value)}\n")
    return "".join(lines).encode()


def _number(value: Any) -> str:
    """floatToGoString's text, without its call for the common case (a finite float below a
    million, where it is the float's repr)."""
    if type(value) is float and -math.inf < value < 1e6:
        return repr(value)
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]  # unannotated there


def _escaped(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
