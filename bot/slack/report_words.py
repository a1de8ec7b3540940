"""The words of `/gpu report` that are not plain scope or window: spans typed in two words,
filler words, and why a word that does not fit is refused, with what to type instead."""

from __future__ import annotations

import re

from bot.slack.freetext import quote
from rules.reports import ScopeKind

SCOPES = {"me": ScopeKind.ME, "lab": ScopeKind.LAB, "team": ScopeKind.TEAM, "pool": ScopeKind.POOL}
_WINDOW_LIKE = re.compile(r"\d[\w-]*", re.ASCII)


def window_like(word: str) -> bool:
    """A word that reads as a window, right or wrong (`7d`, `2026-13`), not as a name."""
    return _WINDOW_LIKE.fullmatch(word) is not None


#: Words read past before a window ("the last 30 days").
FILLERS = frozenset({"last", "past", "the", "for", "over"})
#: Words people use for a window: how to say it back, and the window to write instead.
_WINDOW_WORDS = {
    "day": ("a day", "24h"),
    "today": ("today", "24h"),
    "week": ("a week", "7d"),
    "month": ("a month", "30d"),
    "year": ("a year", "365d"),
}
_UNIT_WORDS = re.compile(r"h|hrs?|hours?|d|days?|w|wks?|weeks?", re.ASCII | re.IGNORECASE)
_WHAT_A_REPORT_TAKES = (
    "A report takes a scope (me, team T, pool P or lab) and a window (7d, 30d, 24h or a month "
    "like 2026-11)."
)


def joined_spans(words: list[str]) -> list[str]:
    """`7 days` as one word, `7days`, which the window reads."""
    out: list[str] = []
    for word in words:
        if out and out[-1].isdigit() and _UNIT_WORDS.fullmatch(word):
            out[-1] += word
        else:
            out.append(word)
    return out


def unread_word(
    word: str, scope: ScopeKind | None, window: str, *, observe: bool
) -> tuple[str, str]:
    """Why `word` does not fit where it stands and what a report takes instead; and a window
    for the example when the word stood for one."""
    low = word.lower()
    if observe:
        return (
            f"I do not know what {quote(word)} means here. `report observe` covers every "
            "observe-only rule and takes only a window (7d, 30d, 24h or a month like 2026-11).",
            "",
        )
    if low in SCOPES and scope is not None:
        return f"{quote(word)} is a second scope after `{scope}`; a report covers one.", ""
    if window_like(low) and window:
        return f"{quote(word)} is a second window after {quote(window)}; give one.", ""
    if low in _WINDOW_WORDS:
        said, instead = _WINDOW_WORDS[low]
        return f"for {said}, write {instead}.", instead
    if low in {"user", "person"} or low.startswith("<@"):
        return (
            f"a report covers you, a team, a pool or the lab, not {quote(word)}; a manager "
            "sees their team person by person with `/gpu report team`.",
            "",
        )
    return f"I do not know what {quote(word)} means here. {_WHAT_A_REPORT_TAKES}", ""
