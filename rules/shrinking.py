"""Which GPUs a shrink gives back: the ones named, or all but `keep`, idle ones first.

Pure: the use case passes the GPUs the lease holds and what telemetry knows of them; a "no"
is a `Problem` with a friendly sentence, never an exception.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

Slot = tuple[str, int]


@dataclass(frozen=True)
class Problem:
    """Why a shrink cannot be done as asked, in words for the person who asked."""

    text: str
    code: str


def gpu_name(slot: Slot) -> str:
    return f"{slot[0]}:{slot[1]}"


def to_give_back(
    lease_code: str,
    held: Sequence[Slot],
    *,
    named: Sequence[Slot] = (),
    keep: int | None = None,
    idle: Collection[Slot] = (),
    empty: Collection[Slot] = (),
) -> tuple[Slot, ...] | Problem:
    """The GPUs to give back, in order: the `named` ones, or all but `keep` of them.

    With `keep`, the GPUs given back are the `idle` ones first (idle for the idle threshold),
    then those telemetry last saw `empty`, then the rest, highest index first; the lease keeps
    its lowest-numbered busy GPUs. A shrink always leaves at least one GPU: giving back all is
    a release."""
    if keep is not None:
        return _all_but(lease_code, held, keep, idle, empty)
    if not named:
        return Problem(f"Which GPUs? `/gpu release {lease_code} gpus node:2,3`.", "no-gpus")
    unknown = [gpu_name(s) for s in named if s not in held]
    if unknown:
        have = ", ".join(gpu_name(s) for s in sorted(held)) or "none"
        return Problem(
            f"{lease_code} does not hold {', '.join(unknown)}; it holds {have}.", "not-held"
        )
    chosen = tuple(dict.fromkeys(named))
    if len(chosen) >= len(held):
        return Problem(
            f"That is every GPU of {lease_code}; `/gpu release {lease_code}` gives the whole "
            "lease back.",
            "all",
        )
    return chosen


def _all_but(
    lease_code: str,
    held: Sequence[Slot],
    keep: int,
    idle: Collection[Slot],
    empty: Collection[Slot],
) -> tuple[Slot, ...] | Problem:
    if keep <= 0:
        return Problem(
            f"Keeping no GPUs is a release: `/gpu release {lease_code}` gives the lease back.",
            "keep-none",
        )
    if keep >= len(held):
        return Problem(
            f"{lease_code} holds {len(held)} GPU{'s' if len(held) != 1 else ''}, so keeping "
            f"{keep} gives nothing back. Say fewer: `/gpu release {lease_code} keep 1`.",
            "keep-all",
        )

    def first_out(slot: Slot) -> tuple[int, str, int]:
        rank = 0 if slot in idle else 1 if slot in empty else 2
        return (rank, slot[0], -slot[1])

    return tuple(sorted(held, key=first_out)[: len(held) - keep])
