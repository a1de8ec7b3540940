"""The NVML source: this host's GPUs through nvidia-ml-py (`pynvml`), the only module in bot/ that
imports it. One init per process; NotSupported cached per GPU and capability; a lost GPU is a
health fact; any other failure is a sample with `error` (unknown, never idle).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pynvml

from bot.telemetry.errors import TelemetryUnavailable
from bot.telemetry.model import ProcessInfo, Sample
from bot.telemetry.procs import Owner, ProcReader

log = logging.getLogger(__name__)

#: Xids the NVIDIA device plugin treats as application faults: the GPU itself is fine.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
XID_EVENT: int = pynvml.nvmlEventTypeXidCriticalError
_MIB = 1 << 20
_EVENT_DRAIN_MAX = 256  # a storm of Xids must not stall the poll

Variant = tuple[str, Callable[[], Any]]


def nvml_error(name: str) -> type[pynvml.NVMLError]:
    """pynvml's own `NVMLError_<name>` class, for fault injection; ValueError if there is none."""
    found = getattr(pynvml, f"NVMLError_{name}", None)
    if not (isinstance(found, type) and issubclass(found, pynvml.NVMLError)):
        raise ValueError(f"pynvml has no error class NVMLError_{name}")
    return found


def nvml_available(functions: Any = pynvml) -> bool:
    """True when NVML loads here and finds at least one GPU."""
    try:
        functions.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return int(functions.nvmlDeviceGetCount()) > 0
    except pynvml.NVMLError:
        return False
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            functions.nvmlShutdown()


def unavailable_reason(exc: pynvml.NVMLError) -> str:
    """One line for a person: why NVML cannot be used on this host and what to do."""
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        why = "libnvidia-ml.so.1 was not found (no NVIDIA driver, or no NVIDIA container runtime)"
    elif isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        why = "the NVIDIA kernel driver is not loaded"
    elif isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
        why = "the NVIDIA driver was upgraded but the old kernel module is loaded; reboot or reload"
    elif isinstance(exc, pynvml.NVMLError_NoPermission):
        why = "no permission to open the GPU devices (run as root or in the video group)"
    else:
        why = f"{type(exc).__name__}: {exc}"
    return f"NVML is not available on this host: {why}"


class NvmlSource:
    """Reads every GPU of this host. `functions` is the pynvml module, or a stand-in with the
    same function names (the simulated fleet, tests); errors are always pynvml's own classes."""

    def __init__(
        self,
        node_name: str,
        *,
        functions: Any = pynvml,
        owners: Callable[[int], Owner] | None = None,
    ) -> None:
        self.node = node_name
        self.nvml = functions
        self.owners = owners or ProcReader().owner
        self._lock = threading.Lock()
        self._started = False
        self._count = 0
        self._handles: dict[int, Any] = {}
        self._identity: dict[int, tuple[str, str]] = {}  # index -> (uuid, model)
        self._gone: set[tuple[str, str]] = set()  # (uuid, variant) NotSupported / not found
        self._events: Any = None
        self._xids: dict[str, int] = {}  # uuid -> critical Xid; sticky until the agent restarts
        self._driver: str | None = None
        self._cuda: str | None = None

    def poll(self, now: datetime) -> list[Sample]:
        """One sample per GPU; raises TelemetryUnavailable when NVML cannot start."""
        with self._lock:
            self._start()
            self._drain_xids()
            return [self._read(index, now) for index in range(self._count)]

    def close(self) -> None:
        """Balance the init; a later poll starts afresh (handles die with the library)."""
        with self._lock:
            if not self._started:
                return
            events, self._events = self._events, None
            self._started = False
            self._handles.clear()
            self._identity.clear()
            if events is not None:
                with contextlib.suppress(pynvml.NVMLError):  # shutdown frees it anyway
                    self.nvml.nvmlEventSetFree(events)
            try:
                self.nvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("NVML shutdown: %s", exc)

    # ---- start-up and events ----------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        try:
            self.nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise TelemetryUnavailable(unavailable_reason(exc)) from None
        self._started = True
        try:
            self._count = int(self.nvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            self._started = False
            with contextlib.suppress(pynvml.NVMLError):
                self.nvml.nvmlShutdown()
            raise TelemetryUnavailable(unavailable_reason(exc)) from None
        try:
            self._events = self.nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("NVML events unavailable (%s): Xids will not be reported", exc)
        self._driver, self._cuda = self._versions()

    def _versions(self) -> tuple[str | None, str | None]:
        """The driver's version and the CUDA version it supports, for each GPU's profile."""
        driver = cuda = None
        with contextlib.suppress(pynvml.NVMLError, AttributeError):
            found = self.nvml.nvmlSystemGetDriverVersion()
            driver = found.decode() if isinstance(found, bytes) else str(found)
        with contextlib.suppress(pynvml.NVMLError, AttributeError):
            number = int(self.nvml.nvmlSystemGetCudaDriverVersion_v2())
            cuda = f"{number // 1000}.{number % 1000 // 10}"
        return driver, cuda

    def _watch(self, uuid: str, handle: Any) -> None:
        if self._events is None:
            return
        try:
            supported = int(self.nvml.nvmlDeviceGetSupportedEventTypes(handle))
            mask = supported & XID_EVENT
            if mask:
                self.nvml.nvmlDeviceRegisterEvents(handle, mask, self._events)
        except pynvml.NVMLError as exc:
            log.info("GPU %s: no Xid events (%s)", uuid, exc)

    def _drain_xids(self) -> None:
        if self._events is None:
            return
        for _ in range(_EVENT_DRAIN_MAX):
            try:
                event = self.nvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError_Timeout:
                return  # the normal "nothing happened"
            except pynvml.NVMLError as exc:
                log.warning("NVML event wait: %s", exc)
                return
            xid = int(event.eventData)
            if not event.eventType & XID_EVENT:
                continue
            if xid in APPLICATION_XIDS:
                continue
            try:
                uuid = _text(self.nvml.nvmlDeviceGetUUID(event.device))
            except pynvml.NVMLError:
                continue  # a lost GPU shows as lost on its own read
            log.warning("GPU %s on %s: Xid %d", uuid, self.node, xid)
            self._xids[uuid] = xid

    # ---- one GPU ----------------------------------------------------------------------

    def _read(self, index: int, now: datetime) -> Sample:
        uuid, model, total = "", "", 0
        try:
            handle = self._handle(index)
            uuid, model = self._identify(index, handle)
            memory = self._first(uuid, self._memory_variants(handle))
            total = memory.total // _MIB if memory is not None else 0
            util = self._one(uuid, "nvmlDeviceGetUtilizationRates", handle)
            processes = self._first(uuid, self._process_variants(handle)) or []
            temperature = self._one(
                uuid, "nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU
            )
            power_mw = self._one(uuid, "nvmlDeviceGetPowerUsage", handle)
            health = self._health(uuid, handle)
        except pynvml.NVMLError as exc:
            # Lost and reset-required both mean no work runs until someone resets the GPU.
            lost = isinstance(exc, pynvml.NVMLError_GpuIsLost | pynvml.NVMLError_ResetRequired)
            health = "lost" if lost else "xid" if uuid in self._xids else "ok"
            error = f"{type(exc).__name__}: {exc}"
            return Sample(
                self.node, index, uuid, model, total, None, None, None, None, health, (), now, error
            )
        return Sample(
            node=self.node,
            index=index,
            uuid=uuid,
            model=model,
            memory_total_mib=total,
            memory_used_mib=memory.used // _MIB if memory is not None else None,
            util_pct=float(util.gpu) if util is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            health=health,
            processes=self._processes(processes),
            taken_at=now,
            driver=self._driver,
            cuda=self._cuda,
        )

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self.nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def _identify(self, index: int, handle: Any) -> tuple[str, str]:
        if index not in self._identity:
            uuid = _text(self.nvml.nvmlDeviceGetUUID(handle))
            model = _text(self.nvml.nvmlDeviceGetName(handle))
            self._identity[index] = (uuid, model)
            self._watch(uuid, handle)
        return self._identity[index]

    def _first(self, uuid: str, variants: Sequence[Variant]) -> Any:
        """The first variant this GPU and driver support; None when none is. A variant that
        answered NotSupported or FunctionNotFound once is never asked again (a fact of the
        product and driver, not a passing fault); every other error propagates."""
        for name, call in variants:
            if (uuid, name) in self._gone:
                continue
            try:
                return call()
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound) as exc:
                log.debug("GPU %s: %s unsupported (%s); not asked again", uuid, name, exc)
                self._gone.add((uuid, name))
        return None

    def _function(self, name: str) -> Callable[..., Any]:
        # An older binding without the symbol is treated like an older driver without it.
        found = getattr(self.nvml, name, None)
        if found is None:
            raise pynvml.NVMLError_FunctionNotFound()
        return found  # type: ignore[no-any-return]

    def _one(self, uuid: str, name: str, *args: Any) -> Any:
        return self._first(uuid, [(name, lambda: self._function(name)(*args))])

    def _memory_variants(self, handle: Any) -> list[Variant]:
        # v2 leaves driver-reserved memory out of `used`; v1 counts it (drivers >= 510.39).
        def get(**version: int) -> Any:
            return self._function("nvmlDeviceGetMemoryInfo")(handle, **version)

        return [
            ("memory_v2", lambda: get(version=pynvml.nvmlMemory_v2)),
            ("memory_v1", get),
        ]

    def _process_variants(self, handle: Any) -> list[Variant]:
        # The unversioned name turns FunctionNotFound into a non-NVML error: ask versions directly.
        def call(name: str) -> Callable[[], Any]:
            return lambda: self._function(name)(handle)

        name = "nvmlDeviceGetComputeRunningProcesses"
        return [(f"processes{v}", call(name + v)) for v in ("_v3", "_v2")]

    def _health(self, uuid: str, handle: Any) -> str:
        if uuid in self._xids:
            return "xid"
        pending = self._one(uuid, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        rows = self._one(uuid, "nvmlDeviceGetRemappedRows", handle)
        dbe = self._one(
            uuid,
            "nvmlDeviceGetTotalEccErrors",
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        # rows = (corrected, uncorrected, pending, failure): a pending/failed remap needs a reset.
        if pending == 1 or (rows is not None and (rows[2] or rows[3])) or (dbe or 0) > 0:
            return "ecc"
        return "ok"

    def _processes(self, raw: Sequence[Any]) -> tuple[ProcessInfo, ...]:
        seen: dict[int, ProcessInfo] = {}
        for proc in raw:
            pid = int(proc.pid)
            if pid <= 0 or pid in seen:  # the driver pads its buffer; a PID may repeat
                continue
            used = proc.usedGpuMemory  # None on WDDM and some MIG setups
            owner = self.owners(pid)
            seen[pid] = ProcessInfo(
                pid=pid,
                user=owner.user,
                container=owner.container,
                job=owner.job,
                used_mib=int(used) // _MIB if used is not None else None,
                started=owner.started,
            )
        return tuple(seen.values())


def _text(value: str | bytes) -> str:
    # Very old bindings return bytes; every maintained tool decodes defensively.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
