"""Process attribution from a /proc tree: Unix user, Slurm job or pod, container, start time."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.telemetry.procs import Owner, ProcReader, passwd_name

CONTAINER = "3f2a9c1d7e4b" + "5a6b7c8d9e0f" * 4 + "0123"  # 64 hex digits
POD = "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
BOOT = 1_700_000_000


def a_proc(
    root: Path, pid: int, *, uid: int = 1000, cgroup: str = "", start_ticks: int = 0
) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "status").write_text(f"Name:\tpython\nState:\tS\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (base / "cgroup").write_text(cgroup)
    # The command name holds a space and parentheses, as `python (a b)` would.
    rest = ["S", *["0"] * 18, str(start_ticks), "0", "0"]
    (base / "stat").write_text(f"{pid} (python (a b)) " + " ".join(rest) + "\n")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_text(f"cpu  1 2 3\nbtime {BOOT}\nprocesses 9\n")
    return tmp_path


def reader(root: Path) -> ProcReader:
    return ProcReader(root, user_name={1000: "alice", 1001: "bob"}.__getitem__, clock_ticks=100)


@pytest.mark.parametrize(
    ("cgroup", "container", "job"),
    [
        (
            "0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0\n",
            None,
            "slurm/1392969",
        ),
        (
            "10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0\n"
            "4:memory:/slurm/uid_2101171/job_280678/step_interactive\n",
            None,
            "slurm/280678",
        ),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n",
            CONTAINER[:12],
            f"pod/{POD}",
        ),
        (f"11:devices:/kubepods/burstable/pod{POD}/{CONTAINER}\n", CONTAINER[:12], f"pod/{POD}"),
        (f"0::/system.slice/docker-{CONTAINER}.scope\n", CONTAINER[:12], None),
        (f"12:pids:/docker/{CONTAINER}\n", CONTAINER[:12], None),
        (f"0::/machine.slice/crio-{CONTAINER}.scope\n", CONTAINER[:12], None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None, None),
    ],
    ids=[
        "slurm-v2",
        "slurm-v1",
        "k8s-systemd",
        "k8s-cgroupfs",
        "docker",
        "docker-v1",
        "crio",
        "ssh",
    ],
)
def test_cgroup_paths_name_the_container_and_the_job(
    proc: Path, cgroup: str, container: str | None, job: str | None
) -> None:
    a_proc(proc, 4242, cgroup=cgroup)
    owner = reader(proc).owner(4242)
    assert (container, job) == (owner.container, owner.job)


def test_the_user_is_the_real_uid_by_its_account_name(proc: Path) -> None:
    a_proc(proc, 4242, uid=1001)
    assert "bob" == reader(proc).owner(4242).user


def test_a_uid_without_a_passwd_entry_is_shown_as_the_number() -> None:
    """Container users often have no entry on the host, as psutil reports them."""
    assert "3999999" == passwd_name(3_999_999)


def test_start_time_is_boot_time_plus_ticks_even_with_parentheses_in_the_name(
    proc: Path,
) -> None:
    """The PID-reuse guard compares this, so it must survive odd command names."""
    a_proc(proc, 4242, start_ticks=123_456)
    assert BOOT + 1234.56 == reader(proc).owner(4242).started


def test_a_process_that_is_gone_has_an_empty_owner(proc: Path) -> None:
    """It exited between the NVML call and the /proc read: unknown, not an error."""
    assert Owner() == reader(proc).owner(999)


def test_an_unreadable_stat_leaves_only_the_start_time_unknown(proc: Path) -> None:
    a_proc(proc, 4242)
    (proc / "4242" / "stat").write_text("garbage")
    owner = reader(proc).owner(4242)
    assert ("alice", None) == (owner.user, owner.started)


def test_every_uid_of_the_process_is_read(proc: Path) -> None:
    """A setuid program runs as its owner whoever started it: the enforcer checks them all."""
    a_proc(proc, 4242, uid=1001)
    (proc / "4242" / "status").write_text("Name:\tpasswd\nUid:\t1001\t0\t0\t0\n")
    owner = reader(proc).owner(4242)
    assert ("bob", (1001, 0, 0, 0)) == (owner.user, owner.uids)


@pytest.mark.parametrize("uid", ["²", "-1", "12345678901", "x"])
def test_a_uid_line_that_is_not_ascii_digits_leaves_the_user_unknown(proc: Path, uid: str) -> None:
    """str.isdigit() would take "²" and then fail in int(); such a line reads as unknown."""
    a_proc(proc, 4242)
    (proc / "4242" / "status").write_text(f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    owner = reader(proc).owner(4242)
    assert (None, ()) == (owner.user, owner.uids)
