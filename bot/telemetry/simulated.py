"""A simulated fleet: fleet files replayed through the real `NvmlSource`, so a fault injected here
reaches the sweep exactly as a real one would (pynvml's own error classes, the same code path).
"""

from __future__ import annotations

import uuid as uuidlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from bot.telemetry.fleet_file import Fleet, FleetNode, Segment
from bot.telemetry.model import Sample
from bot.telemetry.nvml import XID_EVENT, NvmlSource, nvml_error
from bot.telemetry.procs import Owner

_MIB = 1 << 20
_UUIDS = uuidlib.UUID("6f1d3c52-5b1e-4f0c-9a57-8c1f0e4b2d11")  # namespace of simulated UUIDs


def simulated_uuid(node: str, index: int) -> str:
    """Stable across runs, so recorded leases and audit rows keep naming the same GPU."""
    return f"GPU-{uuidlib.uuid5(_UUIDS, f'{node}/{index}')}"


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


class SimulatedNode:
    """The pynvml functions the NVML source calls, answering from one fleet node at `now`.

    `calls` counts every call by name, so tests can see that NotSupported is not asked again.
    """

    def __init__(self, name: str, spec: FleetNode, start: datetime) -> None:
        self.name, self.spec, self.start = name, spec, start
        self.now = start
        self.calls: Counter[str] = Counter()
        self._watched: set[int] = set()
        self._delivered: set[int] = set()  # indices into spec.faults of Xids already delivered

    @property
    def offset(self) -> timedelta:
        return max(self.now - self.start, timedelta(0))

    def _enter(self, call: str, handle: _Handle | None = None) -> Segment | None:
        self.calls[call] += 1
        index = handle.index if handle is not None else None
        for fault in self.spec.faults:
            hits = fault.gpu == index and fault.call in (None, call)
            if fault.error and hits and fault.active(self.offset):
                raise nvml_error(fault.error)()
        if call in self.spec.unsupported:
            raise nvml_error("NotSupported")()
        return self.spec.segment(index, self.offset) if index is not None else None

    def _ecc(self, index: int, kind: str) -> int:
        faults = (f for f in self.spec.faults if f.gpu == index and f.ecc == kind)
        return int(any(f.active(self.offset) for f in faults))

    # ---- library and events -------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return self.spec.gpus

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        if self.spec.driver is None:
            raise nvml_error("NotSupported")()
        return self.spec.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:  # noqa: N802
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        if self.spec.cuda is None:
            raise nvml_error("NotSupported")()
        major, _, minor = self.spec.cuda.partition(".")
        return int(major) * 1000 + int(minor or 0) * 10  # 12.4 -> 12040, as NVML counts

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlEventSetFree(self, event_set: object) -> None:  # noqa: N802
        self._enter("nvmlEventSetFree")

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        return XID_EVENT

    def nvmlDeviceRegisterEvents(self, handle: _Handle, mask: int, event_set: object) -> None:  # noqa: N802
        self._enter("nvmlDeviceRegisterEvents", handle)
        if mask & XID_EVENT:
            self._watched.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        self._enter("nvmlEventSetWait_v2")
        for number, fault in enumerate(self.spec.faults):
            due = fault.xid and fault.at <= self.offset and fault.gpu in self._watched
            if due and number not in self._delivered:
                self._delivered.add(number)
                return SimpleNamespace(
                    device=_Handle(fault.gpu), eventType=XID_EVENT, eventData=fault.xid
                )
        raise nvml_error("Timeout")()

    # ---- one device ---------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        handle = _Handle(index)
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        if not 0 <= index < self.spec.gpus:
            raise nvml_error("InvalidArgument")()
        return handle

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetUUID", handle)
        return simulated_uuid(self.name, handle.index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetName", handle)
        return self.spec.model

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:  # noqa: N802
        segment = self._enter("nvmlDeviceGetMemoryInfo", handle)
        total = self.spec.memory_mib * _MIB
        used = (segment.memory if segment else 0) * _MIB
        return SimpleNamespace(total=total, used=used, free=total - used, reserved=0)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:  # noqa: N802
        segment = self._enter("nvmlDeviceGetUtilizationRates", handle)
        util = int(segment.util) if segment else 0
        return SimpleNamespace(gpu=util, memory=util // 2)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: _Handle) -> list[Any]:  # noqa: N802
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[Any]:  # noqa: N802
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def _processes(self, call: str, handle: _Handle) -> list[Any]:
        segment = self._enter(call, handle)
        if segment is None:
            return []
        share = segment.memory // max(len(segment.processes), 1)
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=(share if p.memory is None else p.memory) * _MIB,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for p in segment.processes
        ]

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        segment = self._enter("nvmlDeviceGetTemperature", handle)
        return 32 + int((segment.util if segment else 0) * 0.45)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        segment = self._enter("nvmlDeviceGetPowerUsage", handle)
        # mW: 60 W idle, 400 W flat out
        return 60_000 + int((segment.util if segment else 0) * 3_400)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return self._ecc(handle.index, "retired")

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        self._enter("nvmlDeviceGetRemappedRows", handle)
        pending = self._ecc(handle.index, "remapped")
        return (0, pending, pending, 0)

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, kind: int, counter: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTotalEccErrors", handle)
        return self._ecc(handle.index, "dbe")

    def owner(self, pid: int) -> Owner:
        """What /proc would say about `pid` on this node now, from the fleet's processes."""
        for index in range(self.spec.gpus):
            segment = self.spec.segment(index, self.offset)
            if segment is None:
                continue
            for proc in segment.processes:
                if proc.pid == pid:
                    begun = self.start + (proc.started or segment.start)
                    return Owner(proc.user, proc.container, proc.job, begun.timestamp())
        return Owner()


class SimulatedSource:
    """Replays `fleet` from `start`; with `node`, only that node (what one agent would see)."""

    def __init__(self, fleet: Fleet, start: datetime, *, node: str | None = None) -> None:
        if node is not None and node not in fleet.nodes:
            known = ", ".join(sorted(fleet.nodes))
            raise ValueError(f"node {node!r} is not in the fleet (it has: {known})")
        names = [node] if node is not None else sorted(fleet.nodes)
        self.nodes = {name: SimulatedNode(name, fleet.nodes[name], start) for name in names}
        self._sources = {
            name: NvmlSource(name, functions=fake, owners=fake.owner)
            for name, fake in self.nodes.items()
        }

    def poll(self, now: datetime) -> list[Sample]:
        samples: list[Sample] = []
        for name, fake in self.nodes.items():
            fake.now = now
            samples.extend(self._sources[name].poll(now))
        return samples

    def close(self) -> None:
        for source in self._sources.values():
            source.close()
