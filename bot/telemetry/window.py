"""What the bot knows about each GPU: the newest sample, how long it has been idle, and the
per-minute rollups owed to the history table. Invariant 3 lives here: stale or failed is unknown.
It also merges the hybrid feed: DCGM's numbers with the node agents' processes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from bot.foreground import give_way
from bot.telemetry.model import ProcessInfo, Sample
from storage.tables import GpuMinuteRow

log = logging.getLogger(__name__)

COVERAGE = 0.8
# The span of sample times taken: the window adds and subtracts minutes and `keep` to and
# from them, and nothing may reach past either end of datetime.
_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)  # far enough from the end to add `keep` and minutes
_MINUTE = timedelta(minutes=1)
_ZERO = timedelta(0)
_CHECK_AFTER = 5  # intervals: below this a single late sample would decide the coverage
# GPUs read in one hold of the lock by the passes over the whole fleet (the sweep's readings,
# the poll's rollups): a push arriving meanwhile waits for one chunk, never for 100,000 GPUs.
_CHUNK = 100


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as the sweep sees it at `now`. `healthy` means no fault reported: a GPU never
    seen is unknown, not unhealthy (health "unknown")."""

    fresh: bool
    unknown: bool
    healthy: bool
    health: str
    util_pct: float | None
    memory_used_mib: int | None
    processes: tuple[ProcessInfo, ...]
    idle_for: timedelta
    last_seen: datetime | None
    memory_total_mib: int | None = None
    # When `processes` were read: last_seen, except in the hybrid feed, where the node agent
    # reads them and DCGM the rest (None: no agent has told).
    processes_at: datetime | None = None


@dataclass(slots=True)
class _Minute:
    samples: int = 0
    ok: int = 0
    util_sum: float = 0.0
    util_n: int = 0
    util_max: float | None = None
    memory_max: int | None = None


@dataclass(slots=True)
class _Gpu:
    last: Sample | None = None
    stretch_start: datetime | None = None  # first idle sample of the current stretch
    stretch_samples: int = 0
    minutes: dict[datetime, _Minute] = field(default_factory=dict)
    rolled_until: datetime | None = None  # minutes before this are in the history already
    # The hybrid feed: once a sample without processes (DCGM) came, the agent's only give those.
    numbers_elsewhere: bool = False
    processes: tuple[ProcessInfo, ...] = ()
    processes_at: datetime | None = None


class TelemetryWindow:
    """Per-GPU state fed by `observe`; thread-safe (agents push while the sweep reads) and
    constant in memory per GPU.

    Idle is by utilisation alone: a sample is busy when util_pct >= idle_threshold_pct. A
    process holding memory without computing does not make a GPU busy (memory held by an idle
    notebook or a hung job is the usual "allocated but idle" case); the reading
    still carries the processes and memory, so the sweep can tell "idle, holding memory" from
    "free".

    `idle_for` spans the current idle stretch, from its first idle sample to the newest one.
    The stretch ends at any busy sample (idle_for back to 0), at a sample that failed or has no
    utilisation (unknown is never idle), at a gap longer than stale_after, and when fewer than
    80 % of the samples expected every `expected_interval` arrived (checked once it spans five
    intervals); a new stretch starts at the next idle sample. So gaps cap idle_for at the last
    dense stretch, and a stale, failed or sparsely sampled GPU never looks idle. Agents must
    push at least every `expected_interval`.

    Hybrid: once a GPU has had a sample that cannot see processes (`processes_known=False`:
    DCGM, Prometheus), those samples alone make its numbers, idleness and history, and a node
    agent's samples of it give only its processes, each kept with its own time. Its reading
    carries the agent's processes while they are fresh (no older than stale_after) and none
    otherwise, and never an agent's processes of another GPU (the UUIDs must agree).

    A sample from the future (taken after now + `max_ahead`, now being the `now` given to
    `observe`, else the `clock`'s) is ignored: taken, it would be the GPU's newest for as long
    as the clock takes to catch up, and every genuine sample until then would look like an old
    one. Should a GPU's newest sample be ahead all the same (the bot's clock stepped back), the
    next sample starts that GPU afresh. Without either, only samples outside the years 2000 to
    9000 are ignored, so that no arithmetic on a sample time can ever fail.
    """

    def __init__(
        self,
        stale_after: timedelta,
        idle_threshold_pct: float = 5.0,
        expected_interval: timedelta = timedelta(seconds=30),
        *,
        keep: timedelta = timedelta(hours=6),
        max_ahead: timedelta = timedelta(minutes=1),
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.stale_after = stale_after
        self.idle_threshold_pct = idle_threshold_pct
        self.expected_interval = expected_interval
        self.keep = keep  # the most minutes waiting for a rollup, should nobody collect them
        self.max_ahead = max_ahead
        self.clock = clock
        self._gpus: dict[tuple[str, int], _Gpu] = {}
        self._lock = threading.Lock()
        self._mismatched: set[tuple[str, int]] = set()  # GPUs warned about, once each

    def observe(self, samples: list[Sample], now: datetime | None = None) -> int:
        """Take new samples; a sample not newer than the GPU's newest (a retried push) is
        ignored, and so is one from the future. Returns how many were taken."""
        if now is None and self.clock is not None:
            now = self.clock()
        horizon = _LATEST if now is None else min(_aware(now), _LATEST) + self.max_ahead
        taken, outside = 0, 0
        with self._lock:
            for given in samples:
                sample = given
                if given.taken_at.tzinfo is None:
                    sample = replace(given, taken_at=_aware(given.taken_at))
                if not _EARLIEST <= sample.taken_at <= horizon:
                    outside += 1
                    continue
                gpu = self._gpus.setdefault((sample.node, sample.index), _Gpu())
                if gpu.last is not None and gpu.last.taken_at > horizon:
                    # Its newest is from the future: start its readings over. The minutes stay,
                    # and so does what was rolled up, so no minute is ever handed out twice.
                    gpu.last, gpu.stretch_start, gpu.stretch_samples = None, None, 0
                if not sample.processes_known:
                    gpu.numbers_elsewhere = True
                elif gpu.numbers_elsewhere:
                    taken += self._take_processes(gpu, sample)
                    continue
                if gpu.last is not None and sample.taken_at <= gpu.last.taken_at:
                    continue
                self._extend_stretch(gpu, sample)
                self._count_minute(gpu, sample)
                gpu.last = sample
                taken += 1
        if outside:
            log.warning("ignored %d samples taken outside %s .. %s", outside, _EARLIEST, horizon)
        return taken

    def gpu(self, node: str, index: int, now: datetime) -> GpuReading:
        with self._lock:
            state = _state(self._gpus.get((node, index)))
        return self._reading(state, _aware(now))

    def readings(self, now: datetime) -> dict[tuple[str, int], GpuReading]:
        """Every GPU ever observed, by (node, index). Each reading is whole, and pushes may be
        taken between one chunk of GPUs and the next, as they may after the last."""
        at = _aware(now)
        span = self._fresh_span(at)
        out: dict[tuple[str, int], GpuReading] = {}
        gpus, reading = self._gpus, self._reading_within
        for keys in self._chunks():
            # Only the fields are copied under the lock; the readings are made after it, so
            # a push never waits for a reading to be built (nor for a pass the interpreter
            # took the lock from while it held the window's).
            with self._lock:
                states = [_state(gpus[key]) for key in keys]
            for key, state in zip(keys, states, strict=True):
                out[key] = reading(state, at, span)
        return out

    def latest(self) -> dict[tuple[str, int], Sample]:
        """The newest sample of every GPU that has one, by (node, index)."""
        with self._lock:
            return {key: gpu.last for key, gpu in self._gpus.items() if gpu.last is not None}

    def minute_rollups(self, now: datetime) -> list[GpuMinuteRow]:
        """Rows for the minutes that are over (allowing one interval for late pushes) and not
        rolled up before; each minute is handed out once."""
        cutoff = now - self.expected_interval
        taken: list[tuple[tuple[str, int], datetime, _Minute]] = []
        for keys in self._chunks():
            with self._lock:
                for key in keys:
                    gpu = self._gpus[key]
                    for minute in sorted(m for m in gpu.minutes if m + _MINUTE <= cutoff):
                        taken.append((key, minute, gpu.minutes.pop(minute)))
                        gpu.rolled_until = max(gpu.rolled_until or minute, minute + _MINUTE)
        # The rows are built after: a table row costs far more than taking its tally.
        return [_row(node, index, minute, tally) for (node, index), minute, tally in taken]

    def _chunks(self) -> Iterator[list[tuple[str, int]]]:
        """Every GPU's key, _CHUNK at a time (GPUs are only ever added); between chunks the
        requests being served go first (bot.foreground)."""
        with self._lock:
            keys = list(self._gpus)
        for start in range(0, len(keys), _CHUNK):
            give_way()
            yield keys[start : start + _CHUNK]

    # ---- internals (called with the lock held) ----------------------------------------

    def _take_processes(self, gpu: _Gpu, sample: Sample) -> int:
        if gpu.processes_at is not None and sample.taken_at <= gpu.processes_at:
            return 0
        if sample.error is not None:
            return 0  # the agent could not read it: the processes it knew stand until stale
        known = gpu.last.uuid if gpu.last is not None else ""
        if known and sample.uuid and known != sample.uuid:
            key = (sample.node, sample.index)
            if key not in self._mismatched:
                self._mismatched.add(key)
                log.warning(
                    "telemetry: %s GPU %d is %s to DCGM and %s to its node agent; the agent's "
                    "processes are ignored until they agree",
                    sample.node,
                    sample.index,
                    known,
                    sample.uuid,
                )
            return 0
        gpu.processes, gpu.processes_at = sample.processes, sample.taken_at
        return 1

    def _extend_stretch(self, gpu: _Gpu, sample: Sample) -> None:
        util = sample.util_pct
        if sample.error is not None or util is None or util >= self.idle_threshold_pct:
            gpu.stretch_start, gpu.stretch_samples = None, 0
            return
        previous = gpu.last.taken_at if gpu.last is not None else None
        start = gpu.stretch_start
        if start is None or previous is None or sample.taken_at - previous > self.stale_after:
            gpu.stretch_start, gpu.stretch_samples = sample.taken_at, 1
            return
        gpu.stretch_samples += 1
        intervals = (sample.taken_at - start) / self.expected_interval
        if intervals >= _CHECK_AFTER and gpu.stretch_samples < COVERAGE * (intervals + 1):
            gpu.stretch_start, gpu.stretch_samples = sample.taken_at, 1

    def _count_minute(self, gpu: _Gpu, sample: Sample) -> None:
        minute = sample.taken_at.replace(second=0, microsecond=0)
        if gpu.rolled_until is not None and minute < gpu.rolled_until:
            return  # that minute is in the history already; a late sample cannot join it
        tally = gpu.minutes.setdefault(minute, _Minute())
        tally.samples += 1
        if sample.error is None:
            tally.ok += 1
            if sample.util_pct is not None:
                tally.util_sum += sample.util_pct
                tally.util_n += 1
                tally.util_max = max(tally.util_max or 0.0, sample.util_pct)
            if sample.memory_used_mib is not None:
                tally.memory_max = max(tally.memory_max or 0, sample.memory_used_mib)
        if len(gpu.minutes) > self.keep / _MINUTE:
            oldest = minute - self.keep
            for stale in [m for m in gpu.minutes if m < oldest]:
                del gpu.minutes[stale]

    def _reading(self, state: _State | None, now: datetime) -> GpuReading:
        """A GPU's reading from its `_state` (made with or without the lock: its fields are
        replaced, never changed in place)."""
        return self._reading_within(state, now, self._fresh_span(now))

    def _fresh_span(self, now: datetime) -> tuple[datetime, datetime] | None:
        """The times no further than stale_after from `now`, as (earliest, latest), worked out
        once for a read of every GPU; None where they reach past either end of datetime."""
        try:
            return now - self.stale_after, now + self.stale_after
        except OverflowError:
            return None

    def _reading_within(
        self, state: _State | None, now: datetime, span: tuple[datetime, datetime] | None
    ) -> GpuReading:
        """`_reading`, given `_fresh_span(now)`: a time t is within stale_after of now, as
        abs(now - t) <= stale_after, when earliest <= t <= latest."""
        if state is None:
            return GpuReading(False, True, True, "unknown", None, None, (), timedelta(0), None)
        last, stretch_start, numbers_elsewhere, agent_processes, agent_at = state
        taken_at = last.taken_at
        ok = last.error is None
        # A sample from further ahead than stale_after is a broken clock, not news.
        if span is not None:
            fresh = ok and span[0] <= taken_at <= span[1]
        else:
            fresh = ok and abs(now - taken_at) <= self.stale_after
        idle_for = _ZERO
        if fresh and stretch_start is not None:
            idle_for = taken_at - stretch_start
        processes = last.processes
        processes_at: datetime | None = taken_at
        if numbers_elsewhere:
            seen = agent_at
            if seen is None:
                told = False
            elif span is not None:
                told = span[0] <= seen <= span[1]
            else:
                told = abs(now - seen) <= self.stale_after
            processes, processes_at = (agent_processes if told else ()), seen
        health = last.health
        return _made(
            fresh,
            not fresh,
            health == "ok",
            health,
            last.util_pct if ok else None,
            last.memory_used_mib if ok else None,
            processes if ok else (),
            idle_for,
            taken_at,
            last.memory_total_mib or None,
            processes_at,
        )


# Each field's slot, stored to directly (a frozen dataclass's __init__ stores every field
# through object.__setattr__, twice as slow; the sweep makes 100,000 readings a pass).
(
    _fresh,
    _unknown,
    _healthy,
    _health,
    _util_pct,
    _memory_used_mib,
    _processes,
    _idle_for,
    _last_seen,
    _memory_total_mib,
    _processes_at,
) = (getattr(GpuReading, name).__set__ for name in GpuReading.__slots__)


def _made(  # noqa: PLR0917 - the fields in order, as GpuReading(...) takes them
    fresh: bool,
    unknown: bool,
    healthy: bool,
    health: str,
    util_pct: float | None,
    memory_used_mib: int | None,
    processes: tuple[ProcessInfo, ...],
    idle_for: timedelta,
    last_seen: datetime | None,
    memory_total_mib: int | None,
    processes_at: datetime | None,
) -> GpuReading:
    """`GpuReading(...)` of these fields, as its own __init__ makes it (no __post_init__)."""
    reading = object.__new__(GpuReading)
    _fresh(reading, fresh)
    _unknown(reading, unknown)
    _healthy(reading, healthy)
    _health(reading, health)
    _util_pct(reading, util_pct)
    _memory_used_mib(reading, memory_used_mib)
    _processes(reading, processes)
    _idle_for(reading, idle_for)
    _last_seen(reading, last_seen)
    _memory_total_mib(reading, memory_total_mib)
    _processes_at(reading, processes_at)
    return reading


# What a reading is made of: the newest sample, the idle stretch's start, whether the numbers
# come from elsewhere (hybrid), and the agent's processes with their time.
_State = tuple[Sample, datetime | None, bool, tuple[ProcessInfo, ...], datetime | None]


def _state(gpu: _Gpu | None) -> _State | None:
    """The fields of `gpu` a reading is made of (taken with the lock held); None when it has
    no sample yet."""
    if gpu is None or gpu.last is None:
        return None
    return gpu.last, gpu.stretch_start, gpu.numbers_elsewhere, gpu.processes, gpu.processes_at


def _row(node: str, index: int, minute: datetime, tally: _Minute) -> GpuMinuteRow:
    return GpuMinuteRow(
        node=node,
        index=index,
        minute=minute,
        util_avg_pct=tally.util_sum / tally.util_n if tally.util_n else None,
        util_max_pct=tally.util_max,
        memory_used_max_mib=tally.memory_max,
        samples=tally.samples,
        ok_samples=tally.ok,
    )


def _aware(moment: datetime) -> datetime:
    # freezegun's clock is naive; every time here is UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
