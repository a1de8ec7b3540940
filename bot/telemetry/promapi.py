"""Prometheus telemetry: the DCGM exporters' series read back from a Prometheus server's HTTP API
(`/api/v1/query`), each GPU placed on its node by the `Hostname` label (else `instance`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from bot.telemetry.dcgm import (
    FB_USED,
    SERIES,
    Fetch,
    Problems,
    ScrapeError,
    Series,
    http_get,
    samples_from_series,
    unknown,
)
from bot.telemetry.errors import EndpointsError
from bot.telemetry.model import Sample
from bot.telemetry.reach import Reach

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
Row = tuple[str, Mapping[str, str], float, datetime]  # name, labels, value, time
#: Every series the DCGM source reads, in one instant query.
VALUES = '{__name__=~"' + "|".join(SERIES) + '"}'
# An instant query answers at its own evaluation time, with the newest sample of the last five
# minutes: when Prometheus stopped scraping a node, only the samples' own times tell.
STAMPS = f"timestamp({FB_USED})"


def prometheus_url(url: str | None) -> str:
    """GPUBOT_PROMETHEUS_URL checked: http(s), a host, no query; EndpointsError says what to set."""
    if not url:
        raise EndpointsError(
            "GPUBOT_TELEMETRY=prometheus needs GPUBOT_PROMETHEUS_URL: the Prometheus server that "
            "scrapes the DCGM exporters, e.g. GPUBOT_PROMETHEUS_URL=http://prometheus:9090"
        )
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise EndpointsError(
            f"GPUBOT_PROMETHEUS_URL={url!r} is not the server's base URL; expected one like "
            "http://prometheus:9090 (a path prefix is fine, a query is not)"
        )
    return parts.geturl().rstrip("/")


def node_of(labels: Mapping[str, str]) -> str | None:
    """The node a series is from: its short `Hostname`, else the host part of `instance`."""
    host = labels.get("Hostname") or ""
    if not host and labels.get("instance"):
        host = urlsplit(f"//{labels['instance']}").hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        host = host.split(".")[0]  # a name: pools.yaml names nodes by their short names
    return host or None


class PrometheusSource:
    """Two instant queries a poll (the values, and FB_USED's sample times); a GPU whose newest
    sample is older than `stale_after`, or that is missing from the answer, or every GPU when
    Prometheus cannot be read, is unknown (a sample with `error`), never idle."""

    def __init__(
        self,
        url: str,
        *,
        stale_after: timedelta = timedelta(minutes=3),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fetch: Fetch | None = None,
    ) -> None:
        self.url = prometheus_url(url)
        self.stale_after = stale_after
        self.timeout_s = timeout_s
        self.fetch: Fetch = fetch or _get_json
        self._known: dict[tuple[str, int], Sample] = {}  # (node, index) -> newest good sample
        self.problems = Problems("Prometheus at")
        self._stale = Problems("Prometheus's samples of", "are fresh again")
        self._failing: frozenset[str] = frozenset()  # nodes none of whose GPUs it read

    def poll(self, now: datetime) -> list[Sample]:
        try:
            values = self._query(VALUES)
            stamps = self._query(STAMPS)
        except ScrapeError as exc:
            self.problems.note(self.url, str(exc))
            why = f"Prometheus at {self.url}: {exc}"
            return [unknown(last, why, now) for last in self._known.values()]
        self.problems.note(self.url, "")
        by_node: dict[str, list[Series]] = defaultdict(list)
        for name, labels, value, _ in values:
            node = node_of(labels)
            if node is not None:
                by_node[node].append((name, labels, value))
        newest = _newest(stamps)
        samples: list[Sample] = []
        stale: dict[str, str] = {}
        stale_gpus: set[tuple[str, int]] = set()
        for node, series in by_node.items():
            for sample in samples_from_series(node, series, now):
                key = (node, sample.index)
                when = newest.get(key)
                if when is not None and now - when > self.stale_after:
                    why = f"its newest sample is from {when:%Y-%m-%d %H:%M:%S} UTC"
                    stale.setdefault(node, why)
                    stale_gpus.add(key)
                    samples.append(unknown(sample, f"Prometheus: {why}", now))
                    continue
                if sample.error is None:
                    self._known[key] = sample
                samples.append(sample)
        for node in set(stale) | set(self._stale.now):
            self._stale.note(node, stale.get(node, ""))
        answered = {(s.node, s.index) for s in samples}
        why = "missing from Prometheus's answer (its exporter's target is down or dropped)"
        missing = [last for key, last in self._known.items() if key not in answered]
        samples.extend(unknown(last, why, now) for last in missing)
        # A node fails when none of its GPUs is read: one GPU left out is that GPU's unknown
        # sample, not a node (or, on every node, the whole feed) down.
        bad = stale_gpus | {(last.node, last.index) for last in missing}
        gpus_of: dict[str, set[tuple[str, int]]] = defaultdict(set)
        for key in (*self._known, *stale_gpus):
            gpus_of[key[0]].add(key)
        self._failing = frozenset(node for node, gpus in gpus_of.items() if gpus <= bad)
        return samples

    def close(self) -> None:
        """Nothing is held between polls."""

    def reach(self) -> Reach:
        """The nodes Prometheus has no fresh samples of; all it ever answered for when the
        server itself fails. `whole`: no node is read (the server, or every node, failing)."""
        nodes = {node for node, _ in list(self._known)}
        if self.problems.now:
            why = "the Prometheus server does not answer"
            return Reach(tuple(sorted(nodes)), True, why)
        failing = set(self._failing)
        whole = bool(failing) and failing >= nodes
        return Reach(tuple(sorted(failing)), whole, "no node has fresh samples" if whole else "")

    def _query(self, query: str) -> list[Row]:
        url = f"{self.url}/api/v1/query?{urlencode({'query': query})}"
        return vector(self.fetch(url, self.timeout_s))


def vector(body: str) -> list[Row]:
    """An instant query's answer as (name, labels, value, time) rows; ScrapeError when it is not
    a successful vector (Prometheus's own error message when it gave one)."""
    try:
        document: Any = json.loads(body)
    except ValueError:
        raise ScrapeError("answered something that is not JSON") from None
    if not isinstance(document, dict):
        raise ScrapeError("answered JSON that is not an API response")
    if document.get("status") != "success":
        kind, error = document.get("errorType", "error"), document.get("error", "no reason given")
        raise ScrapeError(f"the query failed: {kind}: {error}".splitlines()[0][:300])
    data = document.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise ScrapeError("answered something other than an instant vector")
    rows: list[Row] = []
    for item in data.get("result") or []:
        try:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            stamp, text = item["value"]
            value, when = float(text), datetime.fromtimestamp(float(stamp), UTC)
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError, OSError):
            continue  # one malformed row costs only its series
        if math.isfinite(value):
            rows.append((labels.pop("__name__", ""), labels, value, when))
    return rows


def _newest(
    stamps: list[Row],
) -> dict[tuple[str, int], datetime]:
    """When Prometheus last scraped each GPU: `timestamp()`'s value, the newest of a GPU's rows."""
    newest: dict[tuple[str, int], datetime] = {}
    for _, labels, value, _ in stamps:
        node = node_of(labels)
        try:
            key = (node or "", int(labels.get("gpu", "")))
            when = datetime.fromtimestamp(value, UTC)
        except (ValueError, OverflowError, OSError):
            continue
        if node is not None and (key not in newest or when > newest[key]):
            newest[key] = when
    return newest


def _get_json(url: str, timeout_s: float) -> str:
    return http_get(url, timeout_s, accept="application/json")
