"""What `/gpu help` says: one usage line, a summary and examples per subcommand.

The parser takes its examples from here, so a problem reply and the help never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommandHelp:
    usage: str
    summary: str
    details: str
    examples: tuple[str, ...]

    @property
    def example(self) -> str:
        return self.examples[0]


COMMANDS: dict[str, CommandHelp] = {
    "borrow": CommandHelp(
        "/gpu borrow <count> <pool> [for <duration> | until <time>] [priority <level>] "
        "[because <reason>]",
        "Borrow GPUs from a pool.",
        "Words may come in any order. A count without a pool takes the only pool there is; "
        "no duration takes the pool's default. Durations: `6h`, `90m`, `2d`, `1h30m`, "
        "`for 2 hours`. End times are read in your time zone: `until fri 18:00`, "
        "`until tomorrow 9am`, `until 2026-03-05 12:00`. Priority: `priority high`, "
        "`low priority`, `urgent`. Everything after `because`, `reason:` or ` - ` is the reason "
        "your manager reads. `/gpu borrow` alone opens a form.",
        (
            "/gpu borrow 2 a100 for 6h because ablations",
            "/gpu borrow 4 l40s 2d priority high",
            "/gpu borrow 1 until fri 18:00",
        ),
    ),
    "extend": CommandHelp(
        "/gpu extend <lease> <+2h | 2h | until <time>> [because <reason>]",
        "Ask for more time on a lease you hold.",
        "The rules decide at once or ask your manager. `+2h` and `2h` both add two hours; "
        "`until` moves the end to that time.",
        ("/gpu extend L7 +2h because the run needs longer", "/gpu extend 7 until tomorrow 9am"),
    ),
    "release": CommandHelp(
        "/gpu release <lease | all> [gpus <host:index,…> | keep <n>]",
        "Give GPUs back before the lease ends, all of them or some.",
        "`all` releases every lease you hold and withdraws your open requests. "
        "`gpus a100-node-01:2,3` gives back those GPUs and keeps the rest; `keep 1` keeps one "
        "and gives back the others, idle ones first. The lease ends as planned.",
        ("/gpu release L7", "/gpu release all", "/gpu release L7 keep 1"),
    ),
    "mine": CommandHelp(
        "/gpu mine",
        "Your leases and open requests.",
        "Each lease shows its hosts, `CUDA_VISIBLE_DEVICES` and when it ends.",
        ("/gpu mine",),
    ),
    "status": CommandHelp(
        "/gpu status",
        "Pools: free, leased and out-of-service GPUs by model, and what is queued.",
        "Out of service means unhealthy, not reporting, or drained by an admin.",
        ("/gpu status",),
    ),
    "quota": CommandHelp(
        "/gpu quota [team]",
        "A team's quota use and fair share per pool.",
        "Nominal is guaranteed; beyond it a team may borrow others' unused GPUs up to its "
        "borrowing limit. Among borrowers, the team whose recent use is furthest below its "
        "fair share goes first. Without a team name you see your own team.",
        ("/gpu quota", "/gpu quota vision"),
    ),
    "queue": CommandHelp(
        "/gpu queue",
        "Requests waiting for GPUs, in the order they will be served.",
        "A queued request is granted by itself when GPUs come free.",
        ("/gpu queue",),
    ),
    "why": CommandHelp(
        "/gpu why <id>",
        "Why a request or lease went the way it did.",
        "Use R12 for a request, L7 for a lease, A31 for one audit entry. You see your own; "
        "managers see their team's; admins see everything.",
        ("/gpu why R12", "/gpu why L7"),
    ),
    "audit": CommandHelp(
        "/gpu audit <id>",
        "The audit trail of a request, a lease or one audit entry.",
        "Every decision is recorded with the rules that matched, the facts seen and the rules "
        "revision.",
        ("/gpu audit L7", "/gpu audit A31"),
    ),
    "report": CommandHelp(
        "/gpu report [me | team <team> | pool <pool> | lab] [7d | 30d | 24h | YYYY-MM]",
        "GPU hours allocated and used, efficiency, idle time, waits and cost over a window.",
        "Without a scope, members see themselves, managers their team and admins the whole "
        "lab; without a window, the last 7 days. Members see their own use and their team's "
        "totals, managers their team person by person, admins everything. A month such as "
        "`2026-11` is read in your time zone. *Chart* and *CSV* under the answer post the "
        "same figures as a file. Admins: `/gpu report observe [30d]` shows what each "
        "observe-only rule would have done, and how often a would-have reclaim's lease was "
        "busy again soon after.",
        ("/gpu report", "/gpu report team vision 30d", "/gpu report lab 2026-11"),
    ),
    "nodes": CommandHelp(
        "/gpu nodes [node]",
        "Admins only: every node and GPU, whether it reports, and its history.",
        "Each GPU shows where it stands (free, leased, in use without a lease, not reporting, "
        "out of service), its model, memory, UUID, temperature and power. Name a node to see "
        "its GPUs one by one and its latest lifecycle events (joined, not reporting, back, "
        "drained, fault, swapped). `gpubot nodes --history` exports them all.",
        ("/gpu nodes", "/gpu nodes a100-node-02"),
    ),
    "admin": CommandHelp(
        "/gpu admin pause | resume | reload | drain <node> [because …] | undrain <node>",
        "Admins only: the automation kill switch, rule reloads and node drains.",
        "`pause` turns every automatic warning and reclaim into a recorded would-have; manual "
        "commands keep working. `reload` reads the rule files again and keeps the old rules "
        "if the new ones fail. `drain` stops new grants on a node.",
        ("/gpu admin pause", "/gpu admin drain a100-node-02 because fan replacement"),
    ),
    "help": CommandHelp(
        "/gpu help [command]",
        "This help, or the help of one command.",
        "",
        ("/gpu help borrow",),
    ),
}

#: Subcommands in the order help lists them.
SUBCOMMANDS: tuple[str, ...] = tuple(COMMANDS)

OVERVIEW = (
    "*gpubot* lends shared GPUs. Ask in plain words; the rules answer at once, or ask your "
    "manager, or queue you until GPUs come free. Before anything is taken away you get a DM "
    "with time to extend or release."
)

FOOTER = "`/gpu help <command>` explains one command."

#: Under replies that show times, and only there.
TIMES_NOTE = "Times are in your time zone ({zone})."
