"""`/gpu` text to commands: a table of what people type, the problems, and a fuzzer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.services.borrowing import BorrowAsk
from bot.slack.parse import (
    Admin,
    Audit,
    Borrow,
    Command,
    Extend,
    Help,
    Mine,
    Nodes,
    OpenBorrowModal,
    ParseProblem,
    Queue,
    Quota,
    Release,
    Status,
    Why,
    parse,
)
from rules.domain import Priority

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # Monday; 10:00 in Berlin
BERLIN = ZoneInfo("Europe/Berlin")
POOLS = ("a100", "l40s", "inference")
M, H, D = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
HIGH, LOW = Priority.HIGH, Priority.LOW


def read(text: str, pools: tuple[str, ...] = POOLS, tz: ZoneInfo = BERLIN) -> object:
    return parse(text, now=NOW, tz=tz, pools=pools)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Help()),
        ("help", Help()),
        ("HELP borrow", Help("borrow")),
        ("help /gpu extend", Help("extend")),
        ("borrow", OpenBorrowModal()),
        ("borrow 2 a100 for 6h because ablations", Borrow("a100", 2, 6 * H, reason="ablations")),
        ("borrow 4 l40s 2d priority high", Borrow("l40s", 4, 2 * D, HIGH)),
        (
            "Borrow 2 A100 FOR 6H because Ablations on ViT",
            Borrow("a100", 2, 6 * H, reason="Ablations on ViT"),
        ),
        ("borrow a100 2 6h", Borrow("a100", 2, 6 * H)),
        ("borrow for 6h 2 a100", Borrow("a100", 2, 6 * H)),
        ("borrow 2 a100s", Borrow("a100", 2)),
        ("borrow 2x a100", Borrow("a100", 2)),
        ("borrow x3 l40s", Borrow("l40s", 3)),
        ("borrow 2xa100 90m", Borrow("a100", 2, 90 * M)),
        ("borrow two a100 1h30m", Borrow("a100", 2, 90 * M)),
        ("borrow 2 gpus on a100, for 2 hours", Borrow("a100", 2, 2 * H)),
        ("borrow 3 l40s for 3 days", Borrow("l40s", 3, 3 * D)),
        ("borrow l40s for 45 minutes", Borrow("l40s", 1, 45 * M)),
        ("borrow inference 1.5h", Borrow("inference", 1, 90 * M)),
        ("borrow 1 a100 2d priority low", Borrow("a100", 1, 2 * D, LOW)),
        ("borrow 1 a100 high priority", Borrow("a100", 1, None, HIGH)),
        ("borrow 1 a100 prio low", Borrow("a100", 1, None, LOW)),
        ("borrow 1 a100 urgent", Borrow("a100", 1, None, HIGH)),
        ("borrow 1 a100 priority:high", Borrow("a100", 1, None, HIGH)),
        (
            "borrow 2 a100 6h reason: Fine-tune LLaMA",
            Borrow("a100", 2, 6 * H, reason="Fine-tune LLaMA"),
        ),
        ("borrow 2 a100 6h - eval sweep", Borrow("a100", 2, 6 * H, reason="eval sweep")),
        ("borrow 2 a100 until 18:00", Borrow("a100", 2, 8 * H)),
        ("borrow 2 a100 until 08:00", Borrow("a100", 2, 22 * H)),  # passed today: tomorrow
        ("borrow 2 a100 until tomorrow 9am", Borrow("a100", 2, 23 * H)),
        ("borrow 2 a100 until 2026-03-05 12:00", Borrow("a100", 2, 3 * D + 2 * H)),
        ("borrow 2 a100 until monday", Borrow("a100", 2, 6 * D + 23 * H)),  # 9:00 passed today
        ("borrow 2 a100 until fri at 6pm", Borrow("a100", 2, 4 * D + 8 * H)),
        ("borrow 2 a100 until noon", Borrow("a100", 2, 2 * H)),
        ("borrow 2 a100 until thurs 9:30 am", Borrow("a100", 2, 2 * D + 23 * H + 30 * M)),
        ("extend L7 +2h", Extend(7, 2 * H)),
        ("extend 7 2h because the run is slow", Extend(7, 2 * H, reason="the run is slow")),
        ("extend l7 by 90m", Extend(7, 90 * M)),
        ("extend +1d L7", Extend(7, D)),
        ("extend L7 for 2 hours", Extend(7, 2 * H)),
        ("extend L7 until fri 18:00", Extend(7, until=datetime(2026, 3, 6, 17, tzinfo=UTC))),
        ("release all", Release(None)),
        ("release L7", Release(7)),
        ("release 7", Release(7)),
        ("mine", Mine()),
        ("  MINE  ", Mine()),
        ("status", Status()),
        ("queue", Queue()),
        ("quota", Quota()),
        ("quota Vision", Quota("vision")),
        ("why R12", Why("R12")),
        ("why l7", Why("L7")),
        ("audit A31", Audit("A31")),
        ("audit 31", Audit("31")),
        ("admin pause", Admin("pause")),
        ("admin resume", Admin("resume")),
        ("admin reload", Admin("reload")),
        ("admin drain a100-node-02", Admin("drain", "a100-node-02")),
        ("admin undrain a100-node-02", Admin("undrain", "a100-node-02")),
        (
            "admin drain a100-node-02 because Fan swap, back at 3",
            Admin("drain", "a100-node-02", "Fan swap, back at 3"),
        ),
        ("nodes", Nodes()),
        ("nodes a100-node-02", Nodes("a100-node-02")),
        ("?", Help()),
    ],
)
def test_text_reads_as_command(text: str, expected: Command) -> None:
    """What people type becomes the command they meant."""
    assert expected == read(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("borrow 1 until fri 18:00", Borrow("a100", 1, 4 * D + 8 * H)),
        ("borrow 3", Borrow("a100", 3)),
        ("borrow for 2d because training", Borrow("a100", 1, 2 * D, reason="training")),
    ],
)
def test_a_single_pool_needs_no_name(text: str, expected: Command) -> None:
    """With one pool there is nothing to choose."""
    assert expected == read(text, pools=("a100",))


def test_end_times_are_read_in_the_persons_zone() -> None:
    """18:00 in New York is later than 18:00 in Berlin; DST (March 8 in the US) is honoured."""
    new_york = ZoneInfo("America/New_York")
    assert Borrow("a100", 1, 14 * H) == read("borrow a100 until 18:00", tz=new_york)
    assert Borrow("a100", 1, 7 * D + 4 * H) == read(
        "borrow a100 until 2026-03-09 09:00", tz=new_york
    )


def test_borrow_becomes_the_services_ask() -> None:
    """`to_ask` hands the use case exactly what was typed."""
    borrow = read("borrow 2 a100 for 6h priority high because ablations")
    assert isinstance(borrow, Borrow)
    assert BorrowAsk("a100", 2, 6 * H, HIGH, "ablations") == borrow.to_ask()


def test_extend_until_is_measured_from_the_current_end() -> None:
    """`until` adds what separates the lease's end from the asked end; `by` adds itself."""
    ends = datetime(2026, 3, 6, 12, tzinfo=UTC)
    assert 5 * H == Extend(7, until=ends + 5 * H).amount(ends)
    assert 2 * H == Extend(7, by=2 * H).amount(ends)


PROBLEMS = [
    (
        "borrow 2 a100 fo 6h",
        "I understood: 2 GPUs, pool a100, for 6h. I did not understand `fo`. "
        "Try: `/gpu borrow 2 a100 for 6h because ablations`",
    ),
    ("borrow 2 for 6h", "I understood: 2 GPUs, for 6h. Which pool? Pools: `a100`, `inference`"),
    ("borrow 0 a100", "Ask for at least one GPU."),
    ("borrow 2 a100 3 l40s", "`3` contradicts the count given before."),
    ("borrow 2 a100 for 2", "`for 2` needs a unit, e.g. `for 2h`."),
    ("borrow 2 a100 for 6h until fri", "Give a duration or an end time, not both."),
    ("borrow 2 a100 until", "`until` needs a day or a time"),
    ("borrow 2 a100 until 25:00", "I did not understand `25:00`."),
    ("borrow 2 a100 until 2026-03-01 12:00", "is already past"),
    ("borrow 2 a100 for 400d", "is more than a year"),
    ("borrow 2 a100 for 0h", "is no time at all"),
    ("borrow 2 a100 for 6h please now", "I did not understand `now`."),
    ("borrow 2 a100 high", "I did not understand `high`."),
    ("extend", "Which lease? `/gpu mine` lists yours."),
    ("extend L7", "I understood: lease L7. For how long?"),
    ("extend L7 soon", "I did not understand `soon`."),
    ("release", "Which lease? `/gpu release L7` for one, `/gpu release all` for all."),
    ("release L7 L8", "I did not understand `L7 L8`."),
    ("mine please", "`/gpu mine` takes nothing more"),
    ("quota vision nlp", "Name one team"),
    ("why", "Which one? Use R12 for a request"),
    ("audit yesterday", "`yesterday` is not an id."),
    ("admin", "Admin commands: pause, resume, reload, drain, undrain."),
    ("admin drian n1", "Did you mean `drain`?"),
    ("admin drain", "Name one node to drain, optionally followed by `because` and why."),
    ("admin drain n1 because", "Name one node to drain, optionally followed by `because`"),
    ("nodes n1 n2", "Name one node, or none for all"),
    ("borow 2 a100", "Did you mean `/gpu borrow 2 a100`?"),
    ("stauts", "Did you mean `/gpu status`?"),
    ("help borow", "Did you mean `/gpu help borrow`?"),
    ("2 a100 for 6h", "Try: `/gpu borrow 2 a100 for 6h`"),
    ("frobnicate", "Commands: borrow, extend, release, mine, status, quota, queue, why, audit,"),
]


@pytest.mark.parametrize(("text", "fragment"), PROBLEMS)
def test_unreadable_text_says_what_was_understood_and_what_to_try(text: str, fragment: str) -> None:
    """Every problem names what went wrong and ends with an example to type."""
    problem = read(text)
    assert isinstance(problem, ParseProblem)
    assert fragment in problem.message()
    assert "Try: `/gpu" in problem.message()


_WORDS = """
    borrow extend release mine status quota queue why audit admin help
    a100 A100s l40s inference 2 0 x2 3x 2xa100 two 99999 L7 R12 A31 #4 all
    for by until because reason: - + +2h 6h 90m 2d 1h30m 1.5h 0h 400d
    hours minutes days fri friday tomorrow today monday 18:00 9am 6:30 pm noon
    midnight 25:00 2026-03-05 2026-02-30 9999-12-31 at priority prio high low
    urgent priority:high pause drain undrain node-1 please gpus ` <!channel> & é 🙂
"""
VOCABULARY = [*_WORDS.split(), "9" * 300, "\u200b", "\u0663"]  # long digits, ZWSP, Arabic 3


def _assert_well_formed(result: object, pools: tuple[str, ...]) -> None:
    if isinstance(result, ParseProblem):
        assert 0 < len(result.message()) <= 3000
        return
    assert isinstance(result, Command)
    if isinstance(result, Borrow):
        assert result.gpus >= 1
        assert result.pool in pools
        assert result.duration is None or result.duration > timedelta(0)
    if isinstance(result, Extend):
        assert result.amount(NOW) > timedelta(0)


ZONES = st.sampled_from(
    [ZoneInfo(z) for z in ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata")]
)
MOMENTS = st.datetimes(
    min_value=datetime(2000, 1, 1),  # noqa: DTZ001 - hypothesis takes naive bounds with `timezones`
    max_value=datetime(2100, 1, 1),  # noqa: DTZ001 - likewise
    timezones=st.just(UTC),
)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=400), now=MOMENTS, tz=ZONES)
def test_parse_never_raises_on_any_text(text: str, now: datetime, tz: ZoneInfo) -> None:
    """Arbitrary text is a command or a problem with a message that fits a Slack section."""
    _assert_well_formed(parse(text, now=now, tz=tz, pools=POOLS), POOLS)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(st.sampled_from(VOCABULARY), max_size=12),
    now=MOMENTS,
    tz=ZONES,
    pools=st.sampled_from([POOLS, ("a100",), ()]),
)
def test_parse_never_raises_on_token_soup(
    words: list[str], now: datetime, tz: ZoneInfo, pools: tuple[str, ...]
) -> None:
    """Shuffled real vocabulary, the likeliest near-misses, never breaks the parser."""
    _assert_well_formed(parse(" ".join(words), now=now, tz=tz, pools=pools), pools)
