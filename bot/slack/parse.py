"""`/gpu` text to a command: the subcommands, and the forgiving free text of `borrow` and `extend`.

Pure (`now` and the person's zone are parameters); unreadable text becomes a `ParseProblem`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeAlias
from zoneinfo import ZoneInfo

from bot.services.borrowing import BorrowAsk
from bot.slack import texts
from bot.slack.freetext import Words, clip, quote, read_words
from bot.slack.report_words import FILLERS, SCOPES, joined_spans, unread_word, window_like
from rules.domain import Priority, format_duration
from rules.reports import ScopeKind, WindowError, normal_window, parse_window

SUBCOMMANDS = texts.SUBCOMMANDS
ADMIN_ACTIONS = ("pause", "resume", "reload", "drain", "undrain")
_ALIASES = {"?": "help", "-h": "help", "--help": "help"}
_REF = re.compile(r"[rla#]?\d{1,9}", re.ASCII | re.IGNORECASE)
_LEASE = re.compile(r"[l#]?(\d{1,9})", re.ASCII | re.IGNORECASE)
_REASON = re.compile(r"(?:^|(?<=\s))(?:because\b:?|reason:|-(?=\s|$))", re.IGNORECASE)


@dataclass(frozen=True)
class Help:
    topic: str | None = None


@dataclass(frozen=True)
class OpenBorrowModal:
    """`/gpu borrow` alone: the form asks instead."""


@dataclass(frozen=True)
class Borrow:
    pool: str
    gpus: int = 1
    duration: timedelta | None = None  # None: the pool's default applies
    priority: Priority = Priority.NORMAL
    reason: str = ""

    def to_ask(self) -> BorrowAsk:
        return BorrowAsk(self.pool, self.gpus, self.duration, self.priority, self.reason)


@dataclass(frozen=True)
class Extend:
    """More time on a lease: `by` a duration, or `until` an aware UTC moment."""

    lease_id: int
    by: timedelta | None = None
    until: datetime | None = None
    reason: str = ""

    def amount(self, expires_at: datetime) -> timedelta:
        """How much to add to the lease, given when it ends now."""
        if self.by is not None:
            return self.by
        return (self.until or expires_at) - expires_at


@dataclass(frozen=True)
class Release:
    lease_id: int | None  # None: every lease the person holds


@dataclass(frozen=True)
class Shrink:
    """Give back some GPUs of a lease: those named, or all but `keep`."""

    lease_id: int
    gpus: tuple[tuple[str, int], ...] = ()
    keep: int | None = None


@dataclass(frozen=True)
class Mine:
    pass


@dataclass(frozen=True)
class Status:
    pass


@dataclass(frozen=True)
class Queue:
    pass


@dataclass(frozen=True)
class Quota:
    team: str | None = None  # None: the person's own team


@dataclass(frozen=True)
class Why:
    ref: str  # R12, L7, A31 or a bare number, as typed (upper-cased)


@dataclass(frozen=True)
class Audit:
    ref: str


@dataclass(frozen=True)
class Admin:
    action: str  # one of ADMIN_ACTIONS
    node: str | None = None  # for drain and undrain
    reason: str = ""  # why a node is drained (maintenance, a fault, ...)


@dataclass(frozen=True)
class Nodes:
    node: str | None = None  # None: every node


@dataclass(frozen=True)
class Report:
    """`/gpu report`: whose use (None: the person's default) over which window (as typed)."""

    scope: ScopeKind | None = None
    name: str = ""  # the team or pool; "" for `team` alone: the person's own team
    window: str = ""  # 7d, 30d, 24h or YYYY-MM; "": the last 7 days
    observe: bool = False  # `report observe`: what observe-only rules would have done


Command: TypeAlias = (
    (Help | OpenBorrowModal | Borrow | Extend | Release | Mine | Status | Queue | Quota | Why)
    | Shrink
    | Audit
    | Admin
    | Nodes
    | Report
)


@dataclass(frozen=True)
class ParseProblem:
    """Text that did not parse: what was understood, what was not, and what to type instead."""

    understood: list[str] = field(default_factory=list)
    problem: str = ""
    example: str = "/gpu help"

    def message(self) -> str:
        head = f"I understood: {', '.join(self.understood)}. " if self.understood else ""
        return clip(f"{head}{self.problem} Try: `{self.example}`", 3000)


@dataclass(frozen=True)
class _Env:
    now: datetime
    tz: ZoneInfo
    pools: Collection[str]
    teams: Collection[str] = ()


def parse(
    text: str,
    *,
    now: datetime,
    tz: ZoneInfo,
    pools: Collection[str],
    teams: Collection[str] = (),
) -> Command | ParseProblem:
    """Read the text after `/gpu`: empty is help, the first word picks the subcommand.
    `teams`, when given, lets `report team …` name a team that does not exist."""
    parts = text.strip().split(None, 1)
    if not parts:
        return Help()
    sub = _ALIASES.get(parts[0].lower(), parts[0].lower())
    args = parts[1].strip() if len(parts) > 1 else ""
    handler = _HANDLERS.get(sub)
    env = _Env(now, tz, pools, teams)
    if handler is None:
        return _unknown(parts[0], text.strip(), env)
    return handler(args, env)


def split_reason(args: str) -> tuple[str, str]:
    """The words before the reason, and the reason (in its case) after because/reason:/` - `."""
    m = _REASON.search(args)
    return (args, "") if m is None else (args[: m.start()], args[m.end() :].strip())


def parse_borrow(
    args: str, *, now: datetime, tz: ZoneInfo, pools: Collection[str]
) -> Borrow | ParseProblem:
    """The free text of a borrow, in any order: count, pool, duration or end, priority, reason."""
    head, reason = split_reason(args)
    w = read_words(head, now=now, tz=tz, pools=pools, leases=False)
    pool = w.pool or (next(iter(pools)) if len(pools) == 1 else None)
    understood = w.understood()
    if reason:
        understood.append(f"reason {quote(reason, 40)}")
    example = _borrow_example(w, pool, reason, pools)
    if w.trouble:
        return ParseProblem(understood, w.trouble, example)
    if pool is None:
        choice = ", ".join(f"`{p}`" for p in sorted(pools)) or "none are configured"
        return ParseProblem(understood, f"Which pool? Pools: {choice}.", example)
    return Borrow(pool, w.count or 1, w.length(now), w.priority or Priority.NORMAL, reason)


def _borrow_example(w: Words, pool: str | None, reason: str, pools: Collection[str]) -> str:
    name = pool or min(pools, default="a100")
    length = format_duration(w.duration) if w.duration else "6h"
    because = clip(reason, 40).replace("`", "'") or "ablations"
    return f"/gpu borrow {w.count or 2} {name} for {length} because {because}"


def _borrow(args: str, env: _Env) -> Command | ParseProblem:
    if not args:
        return OpenBorrowModal()
    return parse_borrow(args, now=env.now, tz=env.tz, pools=env.pools)


def _extend(args: str, env: _Env) -> Command | ParseProblem:
    head, reason = split_reason(args)
    w = read_words(head, now=env.now, tz=env.tz, pools=(), leases=True)
    example = texts.COMMANDS["extend"].example
    understood = w.understood()
    if w.trouble:
        return ParseProblem(understood, w.trouble, example)
    if w.lease is None:
        return ParseProblem(understood, "Which lease? `/gpu mine` lists yours.", example)
    if w.duration is None and w.until is None:
        return ParseProblem(understood, "For how long? Say `+2h` or `until fri 18:00`.", example)
    return Extend(w.lease, w.duration, w.until, reason)


def _release(args: str, env: _Env) -> Command | ParseProblem:
    words = args.lower().split()
    example = texts.COMMANDS["release"].example
    if words == ["all"]:
        return Release(None)
    if len(words) == 1 and (m := _LEASE.fullmatch(words[0])):
        return Release(int(m.group(1)))
    if len(words) > 1 and words[1] in ("gpus", "gpu", "keep") and (m := _LEASE.fullmatch(words[0])):
        return _shrink(int(m.group(1)), words[1], args.split()[2:], example)
    what = f"I did not understand {quote(args)}. " if words else ""
    return ParseProblem(
        [],
        f"{what}Which lease? `/gpu release L7` for one, `/gpu release all` for all. "
        "`/gpu release L7 keep 1` keeps one of its GPUs and gives back the rest.",
        example,
    )


_GPUS = re.compile(r"([A-Za-z0-9][\w.-]{0,127}):(\d{1,3}(?:,\d{1,3})*)", re.ASCII)


def _shrink(lease: int, how: str, rest: list[str], example: str) -> Command | ParseProblem:
    """`L7 gpus node:2,3` (those GPUs go back) or `L7 keep 1` (all but one go back)."""
    understood = [f"lease L{lease}"]
    if how == "keep":
        if len(rest) == 1 and rest[0].isdecimal() and len(rest[0]) <= 4:
            return Shrink(lease, keep=int(rest[0]))
        return ParseProblem(
            understood, f"Keep how many GPUs? `/gpu release L{lease} keep 1`.", example
        )
    if not rest:
        return ParseProblem(
            understood,
            f"Which GPUs? Name them as host:index, `/gpu release L{lease} gpus node:2,3`.",
            example,
        )
    slots: list[tuple[str, int]] = []
    for word in rest:
        m = _GPUS.fullmatch(word)
        if m is None:
            return ParseProblem(
                understood,
                f"I did not understand {quote(word)}: name GPUs as host:index, "
                f"`/gpu release L{lease} gpus node:2,3`.",
                example,
            )
        slots += [(m.group(1), int(i)) for i in m.group(2).split(",")]
    return Shrink(lease, gpus=tuple(slots))


def _no_args(command: Command) -> Callable[[str, _Env], Command | ParseProblem]:
    name = type(command).__name__.lower()

    def handle(args: str, env: _Env) -> Command | ParseProblem:
        if not args:
            return command
        return ParseProblem(
            [],
            f"`/gpu {name}` takes nothing more; I did not understand {quote(args)}.",
            f"/gpu {name}",
        )

    return handle


def _quota(args: str, env: _Env) -> Command | ParseProblem:
    words = args.lower().split()
    if len(words) <= 1:
        return Quota(words[0] if words else None)
    return ParseProblem(
        [], f"Name one team; I did not understand {quote(args)}.", "/gpu quota vision"
    )


def _nodes(args: str, env: _Env) -> Command | ParseProblem:
    words = args.split()
    if len(words) <= 1:
        return Nodes(words[0] if words else None)
    return ParseProblem(
        [], f"Name one node, or none for all; I did not understand {quote(args)}.", "/gpu nodes"
    )


def _ref(kind: type[Why] | type[Audit]) -> Callable[[str, _Env], Command | ParseProblem]:
    name = kind.__name__.lower()

    def handle(args: str, env: _Env) -> Command | ParseProblem:
        if _REF.fullmatch(args):
            return kind(args.upper())
        what = f"{quote(args)} is not an id." if args else "Which one?"
        problem = f"{what} Use R12 for a request, L7 for a lease, A31 for an audit entry."
        return ParseProblem([], problem, texts.COMMANDS[name].example)

    return handle


def _admin(args: str, env: _Env) -> Command | ParseProblem:
    words = args.split()
    action = words[0].lower() if words else ""
    example = texts.COMMANDS["admin"].example
    if action in ("pause", "resume", "reload") and len(words) == 1:
        return Admin(action)
    if action in ("drain", "undrain") and len(words) == 2:
        return Admin(action, words[1])
    if action in ("drain", "undrain") and len(words) > 2 and words[2].lower() == "because":
        reason = clip(" ".join(words[3:]), 500)
        if reason:
            return Admin(action, words[1], reason)
    if action in ("drain", "undrain"):
        return ParseProblem(
            [],
            f"Name one node to {action}, optionally followed by `because` and why.",
            f"/gpu admin {action} a100-node-02 because fan replacement",
        )
    close = difflib.get_close_matches(action, ADMIN_ACTIONS, n=1, cutoff=0.5)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    problem = f"I did not understand {quote(args) if args else 'an empty admin command'}.{hint} "
    return ParseProblem([], problem + f"Admin commands: {', '.join(ADMIN_ACTIONS)}.", example)


def _report(args: str, env: _Env) -> Command | ParseProblem:
    """`[me | team T | pool P | lab] [7d | 30d | 24h | YYYY-MM]`, scope and window in any order."""
    # Problems quote what was typed as typed (a user id or a name keeps its case).
    typed = joined_spans(args.split())
    read = f"I read {quote(' '.join(['report', *args.split()]))}:"
    words = [word.lower() for word in typed]
    scope: ScopeKind | None = None
    name, window = "", ""
    observe = bool(words) and words[0] == "observe"
    if observe:
        words.pop(0)
        typed.pop(0)
    while words:
        word, as_typed = words.pop(0), typed.pop(0)
        kind = SCOPES.get(word)
        if kind is not None and scope is None and not observe:
            scope = kind
            if kind in (ScopeKind.TEAM, ScopeKind.POOL) and words and _a_name(words[0], env):
                name = words.pop(0)
                typed.pop(0)
        elif not window and window_like(word):
            window = word
        elif word in FILLERS and words:
            continue
        else:
            problem, instead = unread_word(as_typed, scope, window, observe=observe)
            return _report_problem(
                f"{read} {problem}", scope, name, window or instead, observe=observe
            )
    if scope is ScopeKind.POOL and not name:
        pools = _names(env.pools)
        return _report_problem(
            f"{read} which pool? Pools: {pools}.", scope, min(env.pools, default=""), window
        )
    problem, fixed = _report_names(scope, name, env)
    if problem:
        return _report_problem(f"{read} {problem}", scope, fixed, window)
    try:
        parse_window(window, env.now, env.tz)
    except WindowError as exc:
        return _report_problem(f"{read} {exc}", scope, name, observe=observe)
    # The window travels in buttons and file names: written as reports write it.
    return Report(scope, name, normal_window(window), observe=observe)


def _a_name(word: str, env: _Env) -> bool:
    """After `team` or `pool`: a name, unless it reads as a window (a known name always wins)."""
    return word in env.teams or word in env.pools or not window_like(word)


def _report_names(scope: ScopeKind | None, name: str, env: _Env) -> tuple[str, str]:
    """What is wrong with the team or pool named ("" if nothing), and the name to suggest."""
    known = env.teams if scope is ScopeKind.TEAM else env.pools
    if scope not in (ScopeKind.TEAM, ScopeKind.POOL) or not name or not known or name in known:
        return "", name
    noun = str(scope)
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    problem = f"there is no {noun} {quote(name, 64)}{hint}; {noun}s: {_names(known)}."
    return problem, close[0] if close else next(iter(known))


def _names(known: Collection[str]) -> str:
    return ", ".join(known) or "none are configured"


def _report_problem(
    problem: str,
    scope: ScopeKind | None = None,
    name: str = "",
    window: str = "",
    *,
    observe: bool = False,
) -> ParseProblem:
    """The problem, and an example that keeps what was read well and fills in the rest."""
    words = ["/gpu report", "observe" if observe else str(scope or ""), name, window or "7d"]
    return ParseProblem([], problem, " ".join(filter(None, words)).replace("`", "'"))


def _help(args: str, env: _Env) -> Command | ParseProblem:
    topic = args.lower().removeprefix("/gpu ").strip()
    if not topic:
        return Help()
    if topic in texts.COMMANDS:
        return Help(topic)
    return _unknown(args, args, env, prefix="help ")


def _unknown(word: str, text: str, env: _Env, prefix: str = "") -> ParseProblem:
    commands = ", ".join(SUBCOMMANDS)
    borrow = parse_borrow(text, now=env.now, tz=env.tz, pools=env.pools)
    if not prefix and not isinstance(borrow, ParseProblem):
        suggestion = "/gpu borrow " + clip(text, 200).replace("`", "'")
        problem = f"Commands start with a word such as `borrow`. Commands: {commands}."
        return ParseProblem([], problem, suggestion)
    close = difflib.get_close_matches(word.lower(), SUBCOMMANDS, n=1, cutoff=0.5)
    rest = clip(text.removeprefix(word).strip(), 200).replace("`", "'")
    fixed = " ".join(filter(None, [f"/gpu {prefix}{close[0]}", rest])) if close else "/gpu help"
    hint = f" Did you mean `{fixed}`?" if close else ""
    problem = f"I do not know the command {quote(word)}.{hint} Commands: {commands}."
    return ParseProblem([], problem, fixed)


_HANDLERS: dict[str, Callable[[str, _Env], Command | ParseProblem]] = {
    "borrow": _borrow,
    "extend": _extend,
    "release": _release,
    "mine": _no_args(Mine()),
    "status": _no_args(Status()),
    "queue": _no_args(Queue()),
    "quota": _quota,
    "why": _ref(Why),
    "audit": _ref(Audit),
    "admin": _admin,
    "nodes": _nodes,
    "report": _report,
    "help": _help,
}
