"""Fleet files (the demo's `bot/telemetry/fleets/default.yaml`, the tests' `fixtures/fleets/`):
nodes, their GPUs, utilisation timelines relative to the start of a replay, and faults. A
malformed file is refused with `file:line:col: what` lines.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.telemetry.errors import FleetError
from bot.telemetry.nvml import nvml_error
from rules.errors import PolicyError
from rules.expr import parse_duration
from rules.schema import Duration
from rules.yamlsrc import Located, parse

#: The per-GPU NVML calls a simulated node answers; faults and `unsupported` may name them.
CALLS = frozenset(
    {
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
    }
)


def _signed(value: object) -> object:
    # A process may have started before the replay: `-3h`.
    if isinstance(value, str) and value.strip().startswith("-"):
        return -_duration(value.strip()[1:])
    return value


def _duration(value: str) -> timedelta:
    minutes = parse_duration(value)
    if minutes is None:
        raise ValueError(f"expected a duration like 90m, 6h or -2h, got {value!r}")
    return timedelta(minutes=minutes)


SignedDuration = Annotated[Duration, BeforeValidator(_signed)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class FleetProcess(_Strict):
    pid: int = Field(gt=0)
    user: str | None = None
    container: str | None = None
    job: str | None = None
    memory: int | None = Field(default=None, ge=0)  # MiB; default: the segment's, shared
    started: SignedDuration | None = None  # from the replay start; default: the segment's
    # Running at the start, the demo borrows it a lease first; false: it runs without one.
    leased: bool = True


class Segment(_Strict):
    """From `start` on (until the next segment), the GPU reads like this."""

    start: Duration = Field(alias="from")
    util: float = Field(default=0.0, ge=0, le=100)
    memory: int = Field(default=0, ge=0)  # MiB used
    processes: tuple[FleetProcess, ...] = ()


class Fault(_Strict):
    """From `at` (until `until`, if given) `error` is raised by `call` (default: every call on
    the GPU); or an Xid is delivered once through the event set; or ECC counters go bad."""

    gpu: int = Field(ge=0)
    at: Duration
    until: Duration | None = None
    error: str | None = None  # a pynvml NVMLError_<name>: GpuIsLost, Unknown, NotSupported...
    call: str | None = None
    xid: int | None = Field(default=None, gt=0)
    ecc: Literal["remapped", "retired", "dbe"] | None = None

    @field_validator("error")
    @classmethod
    def _real_error(cls, value: str | None) -> str | None:
        if value is not None:
            nvml_error(value)  # ValueError names the class that does not exist
        return value

    @field_validator("call")
    @classmethod
    def _known_call(cls, value: str | None) -> str | None:
        if value is not None and value not in CALLS:
            raise ValueError(f"{value} is not a call a simulated node answers")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Fault:
        kinds = [k for k in ("error", "xid", "ecc") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a fault needs exactly one of error, xid or ecc")
        return self

    def active(self, offset: timedelta) -> bool:
        return self.at <= offset and (self.until is None or offset < self.until)


class FleetNode(_Strict):
    model: str
    memory_mib: int = Field(gt=0)
    gpus: int = Field(gt=0, le=64)
    driver: str | None = Field(default=None, max_length=32)  # what NVML reports, e.g. 550.54.15
    cuda: str | None = Field(default=None, pattern=r"^\d{1,3}(\.\d{1,2})?$")  # e.g. 12.4
    unsupported: frozenset[str] = frozenset()
    timelines: dict[int, tuple[Segment, ...]] = Field(default_factory=dict)
    faults: tuple[Fault, ...] = ()

    @field_validator("unsupported")
    @classmethod
    def _known_calls(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = sorted(value - CALLS)
        if unknown:
            raise ValueError(f"not calls a simulated node answers: {', '.join(unknown)}")
        return value

    @field_validator("timelines")
    @classmethod
    def _timelines(
        cls, value: dict[int, tuple[Segment, ...]], info: ValidationInfo
    ) -> dict[int, tuple[Segment, ...]]:
        gpus = info.data.get("gpus", 0)
        for index, segments in value.items():
            if not 0 <= index < gpus:
                raise ValueError(f"a timeline for GPU {index}, but the node has {gpus} GPUs")
            starts = [s.start for s in segments]
            if starts != sorted(starts) or len(set(starts)) != len(starts):
                raise ValueError(f"GPU {index}: segments must start at increasing times")
        return value

    @field_validator("faults")
    @classmethod
    def _faults(cls, value: tuple[Fault, ...], info: ValidationInfo) -> tuple[Fault, ...]:
        gpus = info.data.get("gpus", 0)
        for fault in value:
            if fault.gpu >= gpus:
                raise ValueError(f"a fault on GPU {fault.gpu}, but the node has {gpus} GPUs")
        return value

    def segment(self, index: int, offset: timedelta) -> Segment | None:
        """The segment in force `offset` after the start; None before the first (idle, empty)."""
        current = None
        for segment in self.timelines.get(index, ()):
            if segment.start > offset:
                break
            current = segment
        return current


class Fleet(_Strict):
    nodes: dict[str, FleetNode] = Field(min_length=1)


def load_fleet(path: Path | str) -> Fleet:
    """Read and validate a fleet file; FleetError with file:line:col lines when it is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetError(f"{path}: cannot read the fleet file: {exc.strerror or exc}") from None
    return parse_fleet(text, str(path))


def parse_fleet(text: str, file: str = "<fleet>") -> Fleet:
    try:
        doc = parse(file, text)
    except PolicyError as exc:
        raise FleetError(str(exc)) from None
    try:
        return Fleet.model_validate(doc.data)
    except ValidationError as exc:
        raise FleetError("\n".join(_problems(doc, exc))) from None


def _problems(doc: Located, exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        path: tuple[Any, ...] = tuple(err["loc"])
        while path and path not in doc.values:
            path = path[:-1]  # pydantic adds validator and union names that are not in the file
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = f"unknown key {err['loc'][-1]!r}"
        elif err["type"] == "missing":
            message = f"missing required key {err['loc'][-1]!r}"
        where = ".".join(str(p) for p in path) or "file"
        lines.append(str(doc.at(path, f"{where}: {message}")))
    return sorted(set(lines))
