"""The NVML source against pynvml's functions substituted by a recorded fleet, raising pynvml's
real error classes: capabilities cached, lost GPUs, transient faults, Xids, no library."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pynvml
import pytest

from bot.telemetry.errors import TelemetryUnavailable
from bot.telemetry.fleet_file import parse_fleet
from bot.telemetry.nvml import NvmlSource, nvml_available, nvml_error
from bot.telemetry.procs import ProcReader
from bot.telemetry.simulated import SimulatedNode
from tests.unit.telemetry.builders import START, at

NODE = """
nodes:
  n1:
    model: NVIDIA A100-SXM4-80GB
    memory_mib: 81920
    gpus: 2
    timelines:
      0:
        - {from: 0m, util: 90, memory: 40000, processes: [{pid: 4242, user: alice, job: slurm/7}]}
"""


def recorded(extra: str = "", node_class: type[SimulatedNode] = SimulatedNode) -> SimulatedNode:
    fleet = parse_fleet(NODE + extra)
    return node_class("n1", fleet.nodes["n1"], START)


def source_for(fake: SimulatedNode) -> NvmlSource:
    return NvmlSource("n1", functions=fake, owners=fake.owner)


def poll(fake: SimulatedNode, source: NvmlSource, minutes: float) -> list[Any]:
    fake.now = at(minutes)
    return source.poll(at(minutes))


def test_a_gpu_reads_identity_memory_utilisation_processes_and_sensors() -> None:
    fake = recorded()
    first, second = source_for(fake).poll(START)
    assert first.uuid.startswith("GPU-")
    assert first.uuid != second.uuid
    assert ("n1", 0, "NVIDIA A100-SXM4-80GB") == (first.node, first.index, first.model)
    assert (81920, 40000, 90.0) == (first.memory_total_mib, first.memory_used_mib, first.util_pct)
    (proc,) = first.processes
    assert (4242, "alice", "slurm/7", 40000) == (proc.pid, proc.user, proc.job, proc.used_mib)
    assert first.temperature_c is not None
    assert first.power_w is not None
    assert ("ok", None, START) == (first.health, first.error, first.taken_at)
    assert (0.0, 0, ()) == (second.util_pct, second.memory_used_mib, second.processes)


def test_nvml_is_initialised_once_per_process_and_shut_down_on_close() -> None:
    fake = recorded()
    source = source_for(fake)
    for minute in range(3):
        poll(fake, source, minute)
    source.close()
    assert (1, 1) == (fake.calls["nvmlInit"], fake.calls["nvmlShutdown"])


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ("nvmlDeviceGetPowerUsage", "power_w"),
        ("nvmlDeviceGetTemperature", "temperature_c"),
        ("nvmlDeviceGetUtilizationRates", "util_pct"),  # MIG-enabled GPUs
    ],
)
def test_a_not_supported_capability_is_asked_once_per_gpu_then_skipped(
    call: str, field: str
) -> None:
    """NotSupported is a fact of the product: the sample carries None, and no error."""
    fake = recorded(f"    unsupported: [{call}]\n")
    source = source_for(fake)
    for minute in range(4):
        samples = poll(fake, source, minute)
    assert 2 == fake.calls[call]
    assert [None, None] == [getattr(s, field) for s in samples]
    assert [None, None] == [s.error for s in samples]


def test_ecc_counters_a_gpu_cannot_report_leave_it_healthy() -> None:
    """A GeForce card answers NotSupported for all of them; that is not a fault."""
    fake = recorded(
        "    unsupported: [nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRemappedRows,"
        " nvmlDeviceGetTotalEccErrors]\n"
    )
    assert ["ok", "ok"] == [s.health for s in source_for(fake).poll(START)]


def test_a_lost_gpu_is_a_lost_sample_with_an_error_and_the_others_still_read() -> None:
    fake = recorded("    faults: [{gpu: 0, at: 30m, error: GpuIsLost}]\n")
    source = source_for(fake)
    assert ["ok", "ok"] == [s.health for s in poll(fake, source, 0)]
    lost, other = poll(fake, source, 31)
    assert ("lost", None, None) == (lost.health, lost.util_pct, lost.memory_used_mib)
    assert "NVMLError_GpuIsLost: GPU is lost" == lost.error
    assert lost.uuid.startswith("GPU-")  # still says which GPU it was
    assert ("ok", None) == (other.health, other.error)


def test_a_gpu_lost_before_the_first_poll_is_lost_by_index() -> None:
    fake = recorded("    faults: [{gpu: 1, at: 0m, error: GpuIsLost}]\n")
    lost = source_for(fake).poll(START)[1]
    assert (1, "lost", "") == (lost.index, lost.health, lost.uuid)


def test_reset_required_reads_as_lost() -> None:
    """No work runs on it until someone resets it: for the sweep that is `lost`."""
    fake = recorded("    faults: [{gpu: 0, at: 0m, error: ResetRequired}]\n")
    assert "lost" == source_for(fake).poll(START)[0].health


def test_any_other_failure_is_an_error_sample_and_is_asked_again_next_poll() -> None:
    """Transient: unknown for that poll only, never cached like NotSupported."""
    fake = recorded(
        "    faults: [{gpu: 0, at: 10m, until: 11m, error: Unknown,"
        " call: nvmlDeviceGetUtilizationRates}]\n"
    )
    source = source_for(fake)
    failed = poll(fake, source, 10)[0]
    assert ("ok", "NVMLError_Unknown: Unknown Error", None) == (
        failed.health,
        failed.error,
        failed.util_pct,
    )
    recovered = poll(fake, source, 11)[0]
    assert (None, 90.0) == (recovered.error, recovered.util_pct)


class OldDriver(SimulatedNode):
    """A driver older than 510.39: no _v3 process list, no memory v2."""

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:  # noqa: N802
        self.calls["nvmlDeviceGetComputeRunningProcesses_v3"] += 1
        raise pynvml.NVMLError_FunctionNotFound()

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:  # noqa: N802
        if version is not None:
            self.calls["memory_v2"] += 1
            raise pynvml.NVMLError_FunctionNotFound()
        return super().nvmlDeviceGetMemoryInfo(handle)


def test_an_older_driver_falls_back_to_v2_processes_and_v1_memory_asking_once() -> None:
    fake = recorded(node_class=OldDriver)
    source = source_for(fake)
    for minute in range(3):
        first = poll(fake, source, minute)[0]
    assert (4242, 40000) == (first.processes[0].pid, first.memory_used_mib)
    assert (2, 2) == (
        fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"],
        fake.calls["memory_v2"],
    )
    assert 6 == fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"]


def test_a_binding_without_a_versioned_function_is_treated_like_an_old_driver() -> None:
    class OldBinding(SimulatedNode):
        # A binding that lacks the symbol altogether (pynvml names are mixedCase).
        nvmlDeviceGetComputeRunningProcesses_v3 = None  # type: ignore[assignment]  # noqa: N815

    first = source_for(recorded(node_class=OldBinding)).poll(START)[0]
    assert (None, 4242) == (first.error, first.processes[0].pid)


def test_a_critical_xid_marks_the_gpu_until_restart_and_an_application_xid_does_not() -> None:
    fake = recorded("    faults: [{gpu: 0, at: 10m, xid: 79}, {gpu: 1, at: 10m, xid: 13}]\n")
    source = source_for(fake)
    assert ["ok", "ok"] == [s.health for s in poll(fake, source, 5)]
    assert ["xid", "ok"] == [s.health for s in poll(fake, source, 11)]
    assert ["xid", "ok"] == [s.health for s in poll(fake, source, 40)]
    assert 2 == fake.calls["nvmlDeviceRegisterEvents"]


@pytest.mark.parametrize("kind", ["remapped", "retired", "dbe"])
def test_memory_faults_make_the_health_ecc(kind: str) -> None:
    fake = recorded(f"    faults: [{{gpu: 1, at: 0m, ecc: {kind}}}]\n")
    assert ["ok", "ecc"] == [s.health for s in source_for(fake).poll(START)]


def test_processes_are_attributed_from_proc(tmp_path: Path) -> None:
    """With the real attribution reader over a /proc tree: user and Slurm job of the pid."""
    base = tmp_path / "4242"
    base.mkdir()
    (base / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
    (base / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_55/step_0\n")
    owners = ProcReader(tmp_path, user_name=lambda uid: f"uid{uid}").owner
    (proc,) = NvmlSource("n1", functions=recorded(), owners=owners).poll(START)[0].processes
    assert ("uid1000", "slurm/55", None) == (proc.user, proc.job, proc.started)


def raising(error: type[Exception]) -> Any:
    def call(*args: object, **kwargs: object) -> None:
        raise error()

    return call


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (pynvml.NVMLError_LibraryNotFound, "libnvidia-ml.so.1 was not found"),
        (pynvml.NVMLError_DriverNotLoaded, "kernel driver is not loaded"),
        (pynvml.NVMLError_LibRmVersionMismatch, "upgraded"),
        (pynvml.NVMLError_NoPermission, "no permission"),
    ],
)
def test_no_usable_nvml_is_telemetry_unavailable_in_one_line(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception], words: str
) -> None:
    """Substituted at the module boundary: the real pynvml module, its nvmlInit raising."""
    monkeypatch.setattr(pynvml, "nvmlInit", raising(error))
    with pytest.raises(TelemetryUnavailable) as caught:
        NvmlSource("n1").poll(START)
    message = str(caught.value)
    assert message.startswith("NVML is not available on this host: ")
    assert words in message
    assert "\n" not in message
    assert caught.value.__suppress_context__


@pytest.mark.skipif(nvml_available(), reason="this machine has a GPU and a driver")
def test_the_real_binding_on_a_machine_without_a_driver_is_unavailable() -> None:
    with pytest.raises(TelemetryUnavailable, match=r"libnvidia-ml\.so\.1 was not found"):
        NvmlSource("n1").poll(START)


def test_nvml_available_says_no_when_init_fails_or_finds_no_gpu() -> None:
    fake = recorded()
    assert nvml_available(fake)
    fake.spec = fake.spec.model_copy(update={"gpus": 0})
    assert not nvml_available(fake)
    fake.nvmlInit = raising(pynvml.NVMLError_DriverNotLoaded)  # type: ignore[method-assign]
    assert not nvml_available(fake)


def test_fault_injection_takes_only_pynvml_s_own_error_classes() -> None:
    assert pynvml.NVMLError_GpuIsLost is nvml_error("GpuIsLost")
    assert 15 == nvml_error("GpuIsLost")().value
    with pytest.raises(ValueError, match="no error class NVMLError_GpuOnFire"):
        nvml_error("GpuOnFire")


def test_a_poll_after_the_gpu_was_lost_keeps_reporting_it_lost() -> None:
    """Lost is not retried hot into health: every poll says lost, none says ok."""
    fake = recorded("    faults: [{gpu: 0, at: 1m, error: GpuIsLost}]\n")
    source = source_for(fake)
    healths = [
        poll(fake, source, m)[0].health
        for m in (0, 2, 3, timedelta(hours=1) / timedelta(minutes=1))
    ]
    assert ["ok", "lost", "lost", "lost"] == healths


def test_a_source_closed_and_polled_again_starts_afresh() -> None:
    """Handles die with nvmlShutdown: the next poll initialises and looks them up again."""
    fake = recorded()
    source = source_for(fake)
    source.poll(START)
    source.close()
    source.close()  # closing twice is harmless
    again = source.poll(START)
    assert (2, 1, 4) == (
        fake.calls["nvmlInit"],
        fake.calls["nvmlShutdown"],
        fake.calls["nvmlDeviceGetHandleByIndex"],
    )
    assert [None, None] == [s.error for s in again]
