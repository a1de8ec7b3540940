"""The scheduler enforcers: what `GPUBOT_ENFORCER=slurm` and `=kubernetes` do to a reclaimed
lease's work and to a drained node, through the scheduler that runs that work.

They take plain values (an order's node and targets) and return a `Step`: what was done, and
whether the order is finished, waits (Slurm's grace) or must be tried again. The bookkeeping
(orders, retries, the audit) is bot.services.enforcement's and bot.services.scheduler_steps';
nothing here touches the database.

    EnforcerUnavailableError   the enforcer cannot work at all as configured (no client library,
                          no cluster configuration); each order counts it as a failed try
"""

from __future__ import annotations

from pathlib import Path

from bot.enforcers.kubernetes import KubernetesEnforcer
from bot.enforcers.model import KUBERNETES, SLURM, Enforcer, EnforcerUnavailableError, Order, Step
from bot.enforcers.slurm import SlurmEnforcer

__all__ = ["KUBERNETES", "SLURM", "Enforcer", "EnforcerUnavailableError", "Order", "Step", "build"]


def build(kind: str, kubeconfig: Path | None = None) -> Enforcer | None:
    """The enforcer for GPUBOT_ENFORCER=`kind`; None for the ones that need none here (notify,
    signal: the node agent signals). Raises EnforcerUnavailableError when it cannot be set up."""
    if kind == SLURM:
        return SlurmEnforcer()
    if kind == KUBERNETES:
        return KubernetesEnforcer.connect(kubeconfig)
    return None
