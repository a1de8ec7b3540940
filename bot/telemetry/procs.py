"""Who owns a GPU process: Unix user, container, Slurm job or Kubernetes pod, and start time,
read from /proc. NVML reports host PIDs, so the agent must run in the host PID namespace.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Slurm: cgroup v2 `/system.slice/slurmstepd.scope/job_1392969/step_0/...`,
# cgroup v1 `/slurm/uid_2101171/job_280678/step_interactive/task_0`.
_SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")
# Kubernetes pod uid, dashes (cgroupfs driver) or underscores (systemd driver).
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# Docker, containerd, CRI-O, podman: `docker-<64hex>.scope`, `/docker/<64hex>`, `/<pod>/<64hex>`.
_CONTAINER = re.compile(
    r"(?:^|/)(?:(?:docker|cri-containerd|crio|containerd|libpod)-)?([0-9a-f]{64})(?:\.scope)?(?:/|$)"
)


_UID = re.compile(r"[0-9]{1,10}")  # ASCII digits only: str.isdigit() also takes "²"
_TICKS = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True, slots=True)
class Owner:
    """What /proc says about one process; every field is None when it cannot be read."""

    user: str | None = None
    container: str | None = None
    job: str | None = None
    started: float | None = None  # epoch seconds
    # real, effective, saved and filesystem uid: whoever may stand behind the process
    uids: tuple[int, ...] = ()


def passwd_name(uid: int) -> str:
    """The account name of `uid`, or the number itself when there is no passwd entry
    (common for container users), as psutil does."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


class ProcReader:
    """Reads owners from a /proc tree (`root` is a parameter so tests can build one)."""

    def __init__(
        self,
        root: Path = Path("/proc"),
        *,
        user_name: Callable[[int], str] = passwd_name,
        clock_ticks: int | None = None,
    ) -> None:
        self.root = root
        self.user_name = user_name
        self.clock_ticks = clock_ticks or _clock_ticks()
        self._boot_time: float | None = None

    def owner(self, pid: int) -> Owner:
        base = self.root / str(pid)
        container, job = _from_cgroup(_read(base / "cgroup"))
        uids = _uids(_read(base / "status"))
        return Owner(
            user=self.user_name(uids[0]) if uids else None,
            container=container,
            job=job,
            started=self._started(_read(base / "stat")),
            uids=uids,
        )

    def _started(self, stat: str | None) -> float | None:
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        if not stat or ")" not in stat:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        # Field 22 (starttime) is the 20th after the name: state is field 3.
        if len(fields) < 20 or not _TICKS.fullmatch(fields[19]):
            return None
        boot = self._boot()
        if boot is None:
            return None
        return boot + int(fields[19]) / self.clock_ticks

    def _boot(self) -> float | None:
        if self._boot_time is None:
            for line in (_read(self.root / "stat") or "").splitlines():
                if line.startswith("btime "):
                    self._boot_time = float(line.split()[1])
        return self._boot_time


def _uids(status: str | None) -> tuple[int, ...]:
    """The `Uid:` line of /proc/<pid>/status: real, effective, saved, filesystem."""
    for line in (status or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()[1:5]
            if fields and all(_UID.fullmatch(f) for f in fields):
                return tuple(int(f) for f in fields)
    return ()


def _from_cgroup(text: str | None) -> tuple[str | None, str | None]:
    container: str | None = None
    job: str | None = None
    for line in (text or "").splitlines():
        path = line.split(":", 2)[-1]
        if job is None and "slurm" in path and (m := _SLURM_JOB.search(path)):
            job = f"slurm/{m.group(1)}"
        if job is None and (m := _POD.search(path)):
            job = "pod/" + m.group(1).replace("_", "-")
        if container is None and (m := _CONTAINER.search(path)):
            container = m.group(1)[:12]  # the short id `docker ps` shows
    return container, job


def _read(path: Path) -> str | None:
    # The process may have exited, or belong to someone we may not inspect: both are "unknown".
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
