"""DCGM telemetry: the DCGM exporter's series turned into `Sample`s, and `DcgmSource`, which scrapes
every node's exporter in parallel. DCGM knows no processes, so its samples say so
(`processes_known=False`) and node agents, where configured, supply them (see window.py).
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bot.telemetry.errors import EndpointsError
from bot.telemetry.model import MAX_INDEX, Sample
from bot.telemetry.nvml import APPLICATION_XIDS
from bot.telemetry.reach import Reach

log = logging.getLogger(__name__)

UTIL = "DCGM_FI_DEV_GPU_UTIL"
ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # a ratio, and truer than UTIL: preferred when exported
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
XID = "DCGM_FI_DEV_XID_ERRORS"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
TEMPERATURE = "DCGM_FI_DEV_GPU_TEMP"
POWER = "DCGM_FI_DEV_POWER_USAGE"
SERIES = (
    UTIL,
    ENGINE,
    FB_USED,
    FB_FREE,
    FB_RESERVED,
    XID,
    REMAP_FAILURE,
    REMAP_PENDING,
    DBE,
    TEMPERATURE,
    POWER,
)
# DCGM's "no value" sentinels (the int32, int64 and fp64 blanks) all lie at or above this; none of
# the series read here comes near it with a real value.
_BLANK = 0x7FFFFFF0
_SUMMED = frozenset({FB_USED, FB_FREE, FB_RESERVED})  # MIG instances' memory adds up
MAX_BODY = 32 << 20  # a node with 16 GPUs and every DCP field exports well under 1 MiB
DEFAULT_TIMEOUT_S = 5.0
MAX_WORKERS = 64

#: One series as read: metric name, labels, value.
Series = tuple[str, Mapping[str, str], float]
Fetch = Callable[[str, float], str]  # (url, timeout_s) -> body; raises ScrapeError


class ScrapeError(Exception):
    """One endpoint could not be read; the message is one line for the log."""


def load_endpoints(path: Path) -> dict[str, str]:
    """GPUBOT_DCGM_ENDPOINTS_FILE: YAML `node: URL`, one DCGM exporter per node. A URL without a
    path gets the exporter's `/metrics`. EndpointsError says what is wrong and how to fix it."""
    where = f"GPUBOT_DCGM_ENDPOINTS_FILE={path}"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise EndpointsError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise EndpointsError(f"{where}: not YAML: {exc}".splitlines()[0]) from None
    example = "e.g. `a100-node-01: http://a100-node-01:9400/metrics`"
    if not isinstance(data, dict) or not data:
        raise EndpointsError(
            f"{where}: expected a mapping of node names to exporter URLs, {example}"
        )
    endpoints: dict[str, str] = {}
    for node, url in data.items():
        if not isinstance(node, str) or not isinstance(url, str):
            raise EndpointsError(
                f"{where}: {node!r}: node names and URLs must be strings, {example}"
            )
        endpoints[node] = exporter_url(url, f"{where}: {node}")
    return endpoints


def exporter_url(url: str, where: str) -> str:
    """`url` checked to be http(s) with a host; the exporter's `/metrics` when it has no path."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointsError(f"{where}: {url!r} is not an http:// or https:// URL with a host")
    if parts.path in ("", "/"):
        return parts._replace(path="/metrics").geturl()
    return parts.geturl()


def read_exposition(text: str, known: dict[str, Mapping[str, str]] | None = None) -> list[Series]:
    """The series of SERIES in Prometheus text exposition; ValueError when it is not that.

    prometheus_client's parser reads labels a character at a time (0.1 ms a line or more), and a
    node repeats one label set per GPU on every series: so each distinct label set is parsed
    once by it, the values by float(), and the series the bot does not read are skipped. A line
    that is neither a comment nor a sample goes to the parser as it is, which refuses it.
    `known` (label block -> labels) carries the parsed label sets from one scrape of a node to
    the next, where they are the same; it is left holding this scrape's."""
    rows: list[tuple[str, str, str]] = []  # name, label block, value
    odd: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            sample = _split(stripped)
            if sample is None:
                odd.append(stripped)
            elif sample[0] in SERIES:
                rows.append(sample)
    blocks = dict.fromkeys(block for _, block, _ in rows)  # distinct, in order
    labels = _label_sets(list(blocks), odd, known if known is not None else {})
    found = [(name, labels[block], float(value)) for name, block, value in rows]
    if known is not None:
        known.clear()
        known.update(labels)
    return found


def _label_sets(
    blocks: list[str], odd: list[str], known: Mapping[str, Mapping[str, str]]
) -> dict[str, Mapping[str, str]]:
    """Each label block's labels: from `known`, else parsed by prometheus_client along with the
    `odd` lines (which it refuses unless they are exposition after all)."""
    labels = {block: known[block] for block in blocks if block in known}
    fresh = [block for block in blocks if block not in labels]
    document = [f"{_PROBE}{{{block}}} {k}" for k, block in enumerate(fresh)] + odd
    if document:
        for family in text_string_to_metric_families("\n".join(document) + "\n"):
            for parsed in family.samples:
                if parsed.name == _PROBE:
                    labels[fresh[int(parsed.value)]] = parsed.labels
    lost = [block for block in blocks if block not in labels]
    if lost:
        raise ValueError(f"labels not understood: {{{lost[0][:80]}}}")
    return labels


_PROBE = "gpubot_label_set"
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _split(line: str) -> tuple[str, str, str] | None:
    """`name{labels} value [timestamp]` as (name, labels, value); None when it is not that."""
    match = _METRIC_NAME.match(line)
    if match is None:
        return None
    after = line[match.end() :]
    rest, block = after.lstrip(), ""
    if rest.startswith("{"):
        close = rest.rfind("}")  # values and timestamps hold no brace: the last one closes
        if close < 0:
            return None
        block, rest = rest[1:close], rest[close + 1 :]
    elif rest == after:  # the name runs into something that is not a space
        return None
    tail = rest.split()
    if not 1 <= len(tail) <= 2:
        return None
    return match.group(), block, tail[0]


@dataclass(slots=True)
class _Gpu:
    """What the series say of one physical GPU: its own rows, and per MIG instance theirs."""

    uuid: str = ""
    model: str = ""
    driver: str | None = None
    device: dict[str, float] = field(default_factory=dict)
    instances: dict[str, dict[str, float]] = field(default_factory=dict)

    def values(self, metric: str) -> list[float]:
        if metric in self.device:
            return [self.device[metric]]
        return [found[metric] for found in self.instances.values() if metric in found]

    def value(self, metric: str) -> float | None:
        """The GPU's own figure; else its MIG instances' memory summed and anything else at
        its highest (the busiest instance, the worst error)."""
        found = self.values(metric)
        if not found:
            return None
        return sum(found) if metric in _SUMMED else max(found)


def samples_from_series(node: str, series: Iterable[Series], taken_at: datetime) -> list[Sample]:
    """One sample per physical GPU (the `gpu` label, as NVML counts them) of `node`.

    MIG: the bot leases whole GPUs, so a GPU's instances fold into it (see _Gpu.value): busy
    when any instance is busy, its memory the sum of theirs, unhealthy when any is."""
    gpus: dict[int, _Gpu] = {}
    for name, labels, value in series:
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            continue
        if not 0 <= index <= MAX_INDEX:
            continue
        gpu = gpus.setdefault(index, _Gpu())
        gpu.uuid = gpu.uuid or labels.get("UUID", "")[:128]
        gpu.model = gpu.model or labels.get("modelName", "")[:128]
        gpu.driver = gpu.driver or (labels.get("DCGM_FI_DRIVER_VERSION") or None)
        if not math.isfinite(value) or value < 0 or value >= _BLANK:
            continue  # DCGM has no value for this field now: as if not exported
        instance = labels.get("GPU_I_ID")
        into = gpu.instances.setdefault(instance, {}) if instance else gpu.device
        # The same GPU repeats once per pod when the exporter maps pods: the same figures.
        into[name] = max(into.get(name, value), value)
    return [_sample(node, index, gpu, taken_at) for index, gpu in sorted(gpus.items())]


def _sample(node: str, index: int, gpu: _Gpu, taken_at: datetime) -> Sample:
    engine = gpu.value(ENGINE)
    util = engine * 100 if engine is not None else gpu.value(UTIL)
    used, free = gpu.value(FB_USED), gpu.value(FB_FREE)
    total = (
        used + free + (gpu.value(FB_RESERVED) or 0) if used is not None and free is not None else 0
    )
    error = None
    if util is None:
        error = f"the DCGM exporter reports neither {UTIL} nor {ENGINE} for this GPU"
    return Sample(
        node=node,
        index=index,
        uuid=gpu.uuid,
        model=gpu.model,
        memory_total_mib=min(int(total), 2**31 - 1),
        memory_used_mib=min(int(used), 2**31 - 1) if used is not None else None,
        util_pct=min(util, 100.0) if util is not None else None,
        temperature_c=gpu.value(TEMPERATURE),
        power_w=gpu.value(POWER),
        health=_health(gpu),
        processes=(),
        taken_at=taken_at,
        error=error,
        driver=gpu.driver,
        processes_known=False,
    )


def _health(gpu: _Gpu) -> str:
    # XID_ERRORS holds the last Xid seen (0: none); an application's own Xid leaves the GPU fine.
    if any(int(xid) and int(xid) not in APPLICATION_XIDS for xid in gpu.values(XID)):
        return "xid"
    # A failed or pending row remap, or an uncorrected error, needs a reset (as NVML reads it).
    if any(gpu.value(name) for name in (REMAP_FAILURE, REMAP_PENDING, DBE)):
        return "ecc"
    return "ok"


def unknown(last: Sample, why: str, now: datetime) -> Sample:
    """`last`'s GPU at `now`, unread: never idle, its health as last known."""
    return replace(
        last,
        memory_used_mib=None,
        util_pct=None,
        temperature_c=None,
        power_w=None,
        processes=(),
        taken_at=now,
        error=why,
    )


class Problems:
    """Why each endpoint cannot be read: one warning line when a problem starts or changes, one
    line when it is over; never a line per poll."""

    def __init__(self, what: str, back: str = "answers again") -> None:
        self.what, self.back = what, back
        self.now: dict[str, str] = {}

    def note(self, key: str, why: str) -> None:
        if self.now.get(key, "") == why:
            return
        if why:
            log.warning(
                "telemetry: %s %s: %s; its GPUs are unknown until it answers", self.what, key, why
            )
            self.now[key] = why
        else:
            log.info("telemetry: %s %s %s", self.what, key, self.back)
            del self.now[key]


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy, no state


def http_get(url: str, timeout_s: float, *, accept: str = "text/plain") -> str:
    """GET `url` within about `timeout_s` in all (a server that trickles its answer is cut off
    too); ScrapeError says why not. Proxy variables are not followed: exporters and Prometheus
    sit on the cluster's own network."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"Accept": accept})  # noqa: S310 - http(s) only, checked at load
    try:
        with _DIRECT.open(request, timeout=timeout_s) as answer:
            chunks: list[bytes] = []
            size = 0
            while chunk := answer.read(1 << 16):
                size += len(chunk)
                if size > MAX_BODY:
                    raise ScrapeError(f"answered more than {MAX_BODY >> 20} MiB")
                if time.monotonic() > deadline:
                    raise ScrapeError(f"no complete answer within {timeout_s:g} s")
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        said = _first_line(exc)
        raise ScrapeError(f"HTTP {exc.code} {exc.reason}{said}") from None
    except urllib.error.URLError as exc:
        raise ScrapeError(f"unreachable: {exc.reason}") from None
    except TimeoutError:
        raise ScrapeError(f"no answer within {timeout_s:g} s") from None
    except OSError as exc:  # a connection reset halfway through the body
        raise ScrapeError(f"connection failed: {exc.strerror or exc}") from None
    return b"".join(chunks).decode("utf-8", "replace")


def _first_line(exc: urllib.error.HTTPError) -> str:
    """What a refusing server said, in brief (Prometheus explains a bad query in its body)."""
    try:
        body = exc.read(2000).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f": {body.splitlines()[0][:300]}" if body else ""


class DcgmSource:
    """Scrapes each node's DCGM exporter, all at once on a thread pool, each within `timeout_s`:
    a slow or dead node costs the poll at most its timeout and leaves its GPUs unknown (samples
    with `error`), never idle. The node's name is the endpoints file's; the `Hostname` label, when
    it disagrees, is reported once in the log."""

    def __init__(
        self,
        endpoints: Mapping[str, str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fetch: Fetch | None = None,
    ) -> None:
        self.endpoints = dict(endpoints)
        self.timeout_s = timeout_s
        self.fetch: Fetch = fetch or http_get
        workers = max(1, min(MAX_WORKERS, len(self.endpoints)))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dcgm-scrape")
        self._rounds = math.ceil(len(self.endpoints) / workers) or 1
        self._pending: dict[str, Future[list[Series]]] = {}
        self._known: dict[str, dict[int, Sample]] = {}  # node -> index -> newest good sample
        self._hostnames: dict[str, str] = {}  # node -> a Hostname label it disagreed with
        self._labels: dict[str, dict[str, Mapping[str, str]]] = {}  # node -> its label sets
        self.problems = Problems("DCGM exporter of")

    def poll(self, now: datetime) -> list[Sample]:
        busy = {node for node, job in self._pending.items() if not job.done()}
        for node, url in self.endpoints.items():
            if node not in busy:
                known = self._labels.setdefault(node, {})
                self._pending[node] = self._pool.submit(self._scrape, url, known)
        # Each scrape ends on its own within about timeout_s; the rounds cover a fleet larger
        # than the pool, and one more second the scheduling.
        wait(list(self._pending.values()), timeout=self.timeout_s * self._rounds + 1)
        samples: list[Sample] = []
        for node, url in self.endpoints.items():
            samples.extend(self._collect(node, url, now, was_busy=node in busy))
        return samples

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def reach(self) -> Reach:
        """The nodes whose exporter failed its last scrape; `whole` when every one did."""
        failing = tuple(node for node in list(self.problems.now) if node in self.endpoints)
        whole = bool(self.endpoints) and len(failing) == len(self.endpoints)
        return Reach(failing, whole, "no DCGM exporter answers" if whole else "")

    def _scrape(self, url: str, known: dict[str, Mapping[str, str]]) -> list[Series]:
        text = self.fetch(url, self.timeout_s)
        try:
            return read_exposition(text, known)
        except ValueError as exc:
            raise ScrapeError(f"not Prometheus text exposition: {exc}".splitlines()[0]) from None

    def _collect(self, node: str, url: str, now: datetime, *, was_busy: bool) -> list[Sample]:
        job = self._pending[node]
        why = ""
        if not job.done():
            why = f"{url}: no answer within {self.timeout_s:g} s"
            if was_busy:
                why = f"{url}: the scrape before this one has not finished yet"
        elif (problem := job.exception()) is not None:
            why = f"{url}: {problem}"
            if not isinstance(problem, ScrapeError):
                why = f"{url}: {type(problem).__name__}: {problem}"
        else:
            series = job.result()
            self._check_hostname(node, series)
            fresh = samples_from_series(node, series, now)
            if fresh:
                self.problems.note(node, "")
                self._known[node] = {s.index: s for s in fresh}
                return fresh
            why = f"{url}: exports no GPU series (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, ...)"
        self.problems.note(node, why)
        return [unknown(last, why, now) for last in self._known.get(node, {}).values()]

    def _check_hostname(self, node: str, series: list[Series]) -> None:
        names = {labels["Hostname"] for _, labels, _ in series if labels.get("Hostname")}
        other = sorted(n for n in names if n.split(".")[0] != node)
        if other and self._hostnames.get(node) != other[0]:
            log.warning(
                "telemetry: the DCGM exporter listed for %s calls its host %s; the endpoints "
                "file's name %s is used (fix GPUBOT_DCGM_ENDPOINTS_FILE if it names the wrong URL)",
                node,
                other[0],
                node,
            )
            self._hostnames[node] = other[0]
