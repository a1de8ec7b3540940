"""The per-GPU window: idle only over dense, fresh, successful samples (invariant 3), any busy
sample resets it, and minute rollups are handed out once per completed minute."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.telemetry.model import Sample
from bot.telemetry.window import _CHUNK, GpuReading, TelemetryWindow
from tests.unit.telemetry.builders import START, a_process, a_sample, at

STALE = timedelta(minutes=3)
MIN = timedelta(minutes=1)


def every(first: float, last: float, step_s: int = 30, **fields: Any) -> list[Sample]:
    """Samples from minute `first` up to (not including) minute `last`, every `step_s`."""
    count = int((last - first) * 60 // step_s)
    return [a_sample(taken_at=at(first, k * step_s), **fields) for k in range(count)]


def error_at(minutes: float, **fields: Any) -> Sample:
    fields = {"util_pct": None, "memory_used_mib": None, "error": "NVMLError_Unknown", **fields}
    return a_sample(taken_at=at(minutes), **fields)


def busy_at(minutes: float) -> Sample:
    return a_sample(taken_at=at(minutes), util_pct=97.0)


def read(samples: list[Sample], now_minutes: float) -> GpuReading:
    telemetry = TelemetryWindow(stale_after=STALE)
    telemetry.observe(samples)
    return telemetry.gpu("a100-node-01", 0, at(now_minutes))


def fifth_missing(first: float, last: float) -> list[Sample]:
    return [s for k, s in enumerate(every(first, last)) if k % 5 != 4]


IDLE_CASES = [
    ("a dense idle hour", every(0, 60), 60, 59.5 * MIN, True),
    (
        "a busy sample resets idle",
        [*every(0, 30), busy_at(30), *every(30.5, 40)],
        40,
        9 * MIN,
        True,
    ),
    ("the newest sample busy is not idle", [*every(0, 30), busy_at(30)], 30.2, 0 * MIN, True),
    ("stale is unknown, never idle", every(0, 60), 59.5 + 3.1, 0 * MIN, False),
    ("a failed call is unknown, never idle", [*every(0, 60), error_at(60)], 60.2, 0 * MIN, False),
    (
        "after a failed call idle counts from the next sample",
        [*every(0, 60), error_at(60), *every(60.5, 70)],
        70,
        9 * MIN,
        True,
    ),
    (
        "a failed call breaks idle even when the sample carries a utilisation figure",
        [*every(0, 60), error_at(60, util_pct=0.0), *every(60.5, 70)],
        70,
        9 * MIN,
        True,
    ),
    (
        "a gap longer than stale_after caps idle at the last dense stretch",
        every(0, 60) + every(65, 90),
        90,
        24.5 * MIN,
        True,
    ),
    ("a gap under stale_after is bridged", every(0, 60) + every(62, 90), 90, 89.5 * MIN, True),
    ("sparse samples never add up to idle", every(0, 120, step_s=120), 120, None, True),
    ("half the samples missing is not enough", every(0, 120, step_s=60), 120, None, True),
    ("80 % of the samples is enough", fifth_missing(0, 120), 120, 119 * MIN, True),
    (
        "memory held without compute is idle",
        every(0, 60, memory_used_mib=30000, processes=(a_process(),)),
        60,
        59.5 * MIN,
        True,
    ),
    ("utilisation at the threshold is busy", every(0, 60, util_pct=5.0), 60, 0 * MIN, True),
    ("utilisation under the threshold is idle", every(0, 60, util_pct=4.9), 60, 59.5 * MIN, True),
    ("no utilisation reading is never idle", every(0, 60, util_pct=None), 60, 0 * MIN, True),
]


@pytest.mark.parametrize(
    ("samples", "now", "idle_for", "fresh"),
    [case[1:] for case in IDLE_CASES],
    ids=[case[0] for case in IDLE_CASES],
)
def test_idle_for_counts_only_dense_fresh_successful_idle_samples(
    samples: list[Sample], now: float, idle_for: timedelta | None, fresh: bool
) -> None:
    """`None` for idle_for: short, whatever the exact figure: far under any idle threshold."""
    reading = read(samples, now)
    assert (fresh, not fresh) == (reading.fresh, reading.unknown)
    if idle_for is None:
        assert reading.idle_for < 5 * MIN
    else:
        assert idle_for == reading.idle_for


def test_a_gpu_never_seen_is_unknown_but_not_unhealthy() -> None:
    reading = TelemetryWindow(stale_after=STALE).gpu("a100-node-01", 0, START)
    assert GpuReading(False, True, True, "unknown", None, None, (), timedelta(0), None) == reading


def test_the_reading_shows_the_newest_sample() -> None:
    newest = a_sample(taken_at=at(1), util_pct=0.0, memory_used_mib=30000, processes=(a_process(),))
    reading = read([a_sample(), newest], 1.5)
    assert (0.0, 30000, newest.processes, at(1)) == (
        reading.util_pct,
        reading.memory_used_mib,
        reading.processes,
        reading.last_seen,
    )


def test_a_failed_sample_shows_nothing_it_did_not_read() -> None:
    reading = read([*every(0, 5, memory_used_mib=9), error_at(5, memory_used_mib=9)], 5)
    assert (None, None, (), at(5)) == (
        reading.util_pct,
        reading.memory_used_mib,
        reading.processes,
        reading.last_seen,
    )


def test_a_lost_gpu_is_unhealthy_and_unknown() -> None:
    reading = read([error_at(0, health="lost")], 0.5)
    assert (False, True, "lost") == (reading.healthy, reading.unknown, reading.health)


def test_an_xid_gpu_is_unhealthy_but_its_readings_stay_fresh() -> None:
    reading = read([a_sample(health="xid")], 0.5)
    assert (False, True, "xid") == (reading.healthy, reading.fresh, reading.health)


def test_a_sample_from_beyond_stale_after_in_the_future_is_not_fresh() -> None:
    """A broken clock on a node must not keep its GPUs fresh for hours."""
    assert not read([a_sample(taken_at=at(10))], 0).fresh
    assert read([a_sample(taken_at=at(2))], 0).fresh


def test_repeated_and_older_samples_are_ignored() -> None:
    """An agent retrying a push it thinks was lost must not count twice."""
    telemetry = TelemetryWindow(stale_after=STALE)
    samples = every(0, 2)
    assert 4 == telemetry.observe(samples)
    assert 0 == telemetry.observe(samples)
    assert 0 == telemetry.observe([a_sample(taken_at=at(0.2), util_pct=99.0)])
    assert 1.5 * MIN == telemetry.gpu("a100-node-01", 0, at(2)).idle_for


def test_readings_cover_every_gpu_observed() -> None:
    telemetry = TelemetryWindow(stale_after=STALE)
    telemetry.observe([a_sample(index=i) for i in range(3)] + [a_sample(node="l40s-node-01")])
    readings = telemetry.readings(at(0.5))
    assert {
        ("a100-node-01", 0),
        ("a100-node-01", 1),
        ("a100-node-01", 2),
        ("l40s-node-01", 0),
    } == set(readings)
    assert all(r.fresh for r in readings.values())


def test_pushes_and_reads_from_many_threads_lose_nothing() -> None:
    telemetry = TelemetryWindow(stale_after=STALE)

    def push(index: int) -> None:
        for sample in every(0, 60, index=index):
            telemetry.observe([sample])
            telemetry.readings(sample.taken_at)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {59.5 * MIN} == {r.idle_for for r in telemetry.readings(at(60)).values()}


def test_completed_minutes_roll_up_once_with_their_figures() -> None:
    telemetry = TelemetryWindow(stale_after=STALE)
    telemetry.observe(
        [
            a_sample(taken_at=at(0), util_pct=10.0, memory_used_mib=100),
            a_sample(taken_at=at(0, 30), util_pct=30.0, memory_used_mib=300),
            a_sample(taken_at=at(1), util_pct=50.0, memory_used_mib=200),
            error_at(1.5),
            error_at(2),
        ]
    )
    rows = telemetry.minute_rollups(at(2, 40))  # minute 2 is not over (allowing 30 s late)
    figures = [
        (r.minute, r.util_avg_pct, r.util_max_pct, r.memory_used_max_mib, r.samples, r.ok_samples)
        for r in rows
    ]
    assert [(at(0), 20.0, 30.0, 300, 2, 2), (at(1), 50.0, 50.0, 200, 2, 1)] == figures
    assert [] == telemetry.minute_rollups(at(2, 40))
    (last,) = telemetry.minute_rollups(at(3, 30))
    assert (at(2), None, None, None, 1, 0) == (
        last.minute,
        last.util_avg_pct,
        last.util_max_pct,
        last.memory_used_max_mib,
        last.samples,
        last.ok_samples,
    )


def test_a_late_sample_for_a_rolled_up_minute_is_not_rolled_up_again() -> None:
    telemetry = TelemetryWindow(stale_after=STALE)
    telemetry.observe([a_sample(taken_at=at(0))])
    assert 1 == len(telemetry.minute_rollups(at(2)))
    telemetry.observe(
        [a_sample(taken_at=at(0, 50))]
    )  # newer than the newest, but that minute is done
    assert [] == telemetry.minute_rollups(at(3))


def test_minutes_nobody_rolls_up_are_dropped_after_keep() -> None:
    """Memory stays bounded even if the rollup job never runs."""
    telemetry = TelemetryWindow(stale_after=STALE, keep=timedelta(minutes=30))
    telemetry.observe(every(0, 120))
    rows = telemetry.minute_rollups(at(121))
    assert 30 <= len(rows) <= 31
    assert at(119) == rows[-1].minute


FAR_FUTURE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def on_clock(now_minutes: float) -> TelemetryWindow:
    """A TelemetryWindow whose clock stands at minute `now_minutes`."""
    return TelemetryWindow(stale_after=STALE, clock=lambda: at(now_minutes))


def test_a_sample_from_the_year_9999_is_ignored_and_genuine_samples_keep_coming() -> None:
    """Taken, it would stay the GPU's newest until the year 9999 and every genuine sample
    would look old; its minute could not even be rolled up (the minute after it does not
    exist)."""
    telemetry = on_clock(3)
    assert 0 == telemetry.observe([a_sample(taken_at=FAR_FUTURE)])
    assert 6 == telemetry.observe(every(0, 3))
    reading = telemetry.gpu("a100-node-01", 0, at(3))
    assert (True, at(2, 30), 2.5 * MIN) == (reading.fresh, reading.last_seen, reading.idle_for)
    assert [at(0), at(1)] == [row.minute for row in telemetry.minute_rollups(at(3))]


def test_a_sample_more_than_max_ahead_of_now_is_ignored_one_within_it_is_taken() -> None:
    telemetry = on_clock(0)
    assert 0 == telemetry.observe([a_sample(taken_at=at(1, 1))])
    assert 1 == telemetry.observe([a_sample(taken_at=at(1))])


def test_the_now_given_to_observe_wins_over_the_clock() -> None:
    """The ingest passes the time the push arrived."""
    telemetry = on_clock(0)
    assert 1 == telemetry.observe([a_sample(taken_at=at(30))], at(30))


def test_a_gpu_whose_newest_sample_is_ahead_of_the_clock_starts_over() -> None:
    """The bot's clock stepped back (or a sample got in before this check existed): the next
    genuine sample is taken, not ignored until the clock catches up."""
    minute = [60.0]
    telemetry = TelemetryWindow(stale_after=STALE, clock=lambda: at(minute[0]))
    assert 1 == telemetry.observe([a_sample(taken_at=at(60))])
    minute[0] = 0.0
    assert 2 == telemetry.observe(every(0, 1))
    assert at(0, 30) == telemetry.gpu("a100-node-01", 0, at(1)).last_seen


@pytest.mark.parametrize(
    "taken_at",
    [
        FAR_FUTURE,
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, 0, 0, 30, tzinfo=UTC),
        START.replace(tzinfo=None),  # naive: read as UTC
    ],
)
def test_observe_readings_and_rollups_never_raise_whatever_the_time(taken_at: datetime) -> None:
    telemetry = TelemetryWindow(stale_after=STALE, clock=lambda: FAR_FUTURE)
    telemetry.observe([a_sample(taken_at=taken_at), a_sample(index=1)])
    for now in (START, FAR_FUTURE, datetime(1, 1, 1, tzinfo=UTC), START.replace(tzinfo=None)):
        assert len(telemetry.readings(now)) <= 2
        telemetry.gpu("a100-node-01", 0, now)
    telemetry.minute_rollups(FAR_FUTURE)


def test_without_a_clock_only_times_no_bot_could_mean_are_ignored() -> None:
    """With no clock and no `now` (a test's window), samples of any plausible time are taken;
    the year 9999 and the year 1 are not, so nothing can overflow."""
    telemetry = TelemetryWindow(stale_after=STALE)
    far_past = datetime(1, 1, 1, tzinfo=UTC)
    assert 0 == telemetry.observe([a_sample(taken_at=FAR_FUTURE), a_sample(taken_at=far_past)])
    assert 1 == telemetry.observe([a_sample(taken_at=START.replace(year=2999))])


class Interleaved(TelemetryWindow):
    """A window that, between two chunks of a pass over the fleet, has another thread push a
    sample and notes whether that push got through before the pass went on."""

    def __init__(self) -> None:
        super().__init__(stale_after=STALE)
        self.pushed_between: list[bool] = []

    def _chunks(self) -> Iterator[list[tuple[str, int]]]:
        for k, keys in enumerate(super()._chunks()):
            if k == 1:
                push = threading.Thread(
                    target=self.observe, args=([busy_at(1)],), name="a push", daemon=True
                )
                push.start()
                push.join(10)
                self.pushed_between.append(not push.is_alive())
            yield keys


def a_fleet(window: TelemetryWindow, gpus: int) -> None:
    window.observe(
        [a_sample(node=f"node-{k // 8:05d}", index=k % 8, taken_at=at(0)) for k in range(gpus)]
    )


@pytest.mark.parametrize("sweep_or_poll", ["readings", "rollups"])
def test_a_push_is_taken_between_chunks_of_a_sweep_or_poll_a_big_fleet(sweep_or_poll: str) -> None:
    """The sweep's readings and the poll's rollups of 4,005 GPUs leave the lock between
    chunks: a push arriving meanwhile is taken then, not after the whole fleet, and the pass
    still covers every GPU it began with."""
    window = Interleaved()
    a_fleet(window, 2 * _CHUNK + 5)
    if sweep_or_poll == "readings":
        got = len(window.readings(at(1)))
    else:
        got = len(window.minute_rollups(at(5)))
    assert [True] == window.pushed_between
    assert 2 * _CHUNK + 5 == got  # the fleet as it was when the pass began


@pytest.mark.parametrize(
    "offset",
    [
        -STALE,
        -STALE - timedelta(microseconds=1),
        STALE,
        STALE + timedelta(microseconds=1),
        timedelta(0),
    ],
)
def test_a_read_of_every_gpu_judges_freshness_as_one_gpu_read_does(offset: timedelta) -> None:
    """Fresh within stale_after either side of now, both ends included, whichever read."""
    telemetry = TelemetryWindow(stale_after=STALE)
    telemetry.observe([a_sample(taken_at=at(0))])
    now = at(0) - offset
    one, every_gpu = telemetry.gpu("a100-node-01", 0, now), telemetry.readings(now)
    assert every_gpu == {("a100-node-01", 0): one}
    assert one.fresh == (abs(offset) <= STALE)
    assert type(one) is GpuReading
    assert one == GpuReading(*(getattr(one, f) for f in one.__slots__))


def test_a_read_of_every_gpu_at_the_end_of_time_still_reads() -> None:
    telemetry = TelemetryWindow(stale_after=STALE)
    telemetry.observe([a_sample(taken_at=at(0))])
    for now in (datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)):
        assert telemetry.readings(now) == {
            ("a100-node-01", 0): telemetry.gpu("a100-node-01", 0, now)
        }
        assert not telemetry.readings(now)[("a100-node-01", 0)].fresh
