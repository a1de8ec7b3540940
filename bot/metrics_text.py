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
    """A gauge or counter family of many plain samples, kept as one list per label and one of
    values, and written to text in one pass: no dict, tuple or Sample kept per sample, which
    at 12,500 nodes cost more than the database's answer (the collector's passes over a large
    heap, as much as the writing). prometheus_client's own writer still reads it (through
    `samples`), to the same bytes."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], *, typ: str = "gauge"
    ) -> None:
        super().__init__(name, documentation, typ)
        self.labels = tuple(labels)
        self.columns: list[list[str]] = [[] for _ in self.labels]
        self.values: list[float] = []

    def add_metric(self, values: Sequence[str], value: float) -> None:
        for column, label in zip(self.columns, values, strict=True):
            column.append(label)
        self.values.append(float(value))

    @property  # Metric keeps a plain list; the columns are turned into one on demand
    def samples(self) -> list[Sample]:
        name = self._sample_name()
        return [
            Sample(name, dict(zip(self.labels, row[:-1], strict=True)), row[-1])
            for row in zip(*self.columns, self.values, strict=True)
        ]

    @samples.setter
    def samples(self, _: list[Sample]) -> None:
        # Metric.__init__ sets an empty list; the columns are the samples here.
        pass

    def _sample_name(self) -> str:
        return self.name + ("_total" if self.type == "counter" else "")

    def text(self) -> bytes:
        return _written(self)


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
    family = ManySamples(metric.name, metric.documentation, names, typ=metric.type)
    family.columns = [[s.labels[k] for s in metric.samples] for k in names]
    family.values = [s.value for s in metric.samples]
    return family.text()


def _written(family: ManySamples) -> bytes:
    name, typ, labels = family._sample_name(), family.type, family.labels
    columns, values = family.columns, family.values
    documentation = family.documentation
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n"]
    order = sorted(range(len(labels)), key=lambda i: labels[i])  # as generate_latest sorts
    # each label's column escaped at once (a pool's name repeats on every node: once each)
    texts = []
    for i in order:
        seen: dict[str, str] = {}
        texts.append(
            [f'{labels[i]}="{seen.get(v) or seen.setdefault(v, _escaped(v))}"' for v in columns[i]]
        )
    if texts:
        lines += [
            f"{name}{{{','.join(parts)}}} {_number(value)}\n"
            for *parts, value in zip(*texts, values, strict=True)
        ]
    else:
        lines += [f"{name} {_number(value)}\n" for value in values]
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
