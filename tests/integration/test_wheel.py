"""The wheel is what gets installed: built from the tree, installed into a fresh virtual
environment outside it, its `gpubot rules check`, `gpubot demo` and `gpubot serve --http` run
from a directory where no source tree, and no fixtures/, is in reach.

Nothing is downloaded: the wheel is built with this environment's setuptools (no build
isolation), installed with `--no-deps --no-index`, and the new environment borrows this one's
third-party packages through a path in a .pth file. Python does not process the .pth files of a
directory reached that way, so this environment's editable install of gpubot stays out of sight.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.localslack import LocalSlack
from bot.server import free_port
from bot.services.rule_files import read_rules_dir
from bot.settings import DEFAULT_RULES_DIR
from bot.telemetry.nvml import nvml_available
from rules.loader import load_policy
from tests.support.serve import Served

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bot", "rules", "storage")
SHIPPED = ("pyproject.toml", "README.md", *PACKAGES)  # what deploy/Dockerfile builds from
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Installed:
    """The built wheel and the virtual environment it is installed in."""

    source: Path  # the copy of the tree the wheel was built from
    wheel: Path
    venv: Path
    outside: Path  # an empty working directory, outside the tree

    @property
    def gpubot(self) -> Path:
        return self.venv / "bin" / "gpubot"

    def env(self) -> dict[str, str]:
        """This process's environment without proxies, PYTHONPATH or any gpubot or Slack
        setting, so each command runs on its defaults."""
        return {
            name: value
            for name, value in os.environ.items()
            if not name.lower().endswith("_proxy")
            and name != "PYTHONPATH"
            and not name.startswith(("GPUBOT_", "SLACK_"))
        }

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - the installed console script and interpreter
            argv,
            cwd=self.outside,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _quiet(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)  # noqa: S603
    assert 0 == done.returncode, f"{' '.join(argv)}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    for name in SHIPPED:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    dist, venv, outside = base / "dist", base / "venv", base / "outside"
    outside.mkdir()
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q")
    _quiet(
        *pip,
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        str(dist),
        str(source),
    )
    (wheel,) = dist.glob("gpubot-*.whl")
    _quiet(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    _quiet(*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel))
    found = subprocess.run(  # noqa: S603
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    ours = sysconfig.get_paths()["purelib"]
    (Path(found.stdout.strip()) / "gpubot-dependencies.pth").write_text(ours + "\n")
    return Installed(source, wheel, venv, outside)


def test_the_wheel_holds_every_file_of_the_packages(installed: Installed) -> None:
    """Rule files, their README, migrations, the demo's fleet and page: all package data."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
    tree = {
        path.relative_to(installed.source).as_posix()
        for package in PACKAGES
        for path in (installed.source / package).rglob("*")
        if path.is_file()
    }
    assert [] == sorted(tree - names)
    assert {
        "bot/telemetry/fleets/default.yaml",
        "bot/workspace/static/index.html",
        "rules/policies/pools.yaml",
        "rules/policies/tests/requests.yaml",
        "rules/README.md",
        "storage/migrations/env.py",
        "storage/migrations/script.py.mako",
    } <= names
    assert not [name for name in names if name.startswith("fixtures/")]


def test_the_installed_gpubot_is_the_wheel_not_the_tree(installed: Installed) -> None:
    """bot, rules and storage load from the new environment; the tree is not on sys.path."""
    code = (
        "import json, sys, bot, rules, storage\n"
        "from bot.telemetry.sources import DEFAULT_FLEET\n"
        "print(json.dumps([[m.__file__ for m in (bot, rules, storage)], sys.path,"
        " str(DEFAULT_FLEET), DEFAULT_FLEET.is_file()]))"
    )
    done = installed.run(str(installed.venv / "bin" / "python"), "-c", code)
    assert 0 == done.returncode, done.stderr
    files, path, fleet, fleet_exists = json.loads(done.stdout)
    venv = str(installed.venv)
    assert all(file.startswith(venv) for file in files), files
    assert not [entry for entry in path if entry and Path(entry).resolve() == ROOT]
    assert fleet.startswith(venv)
    assert fleet_exists


def test_rules_check_from_the_wheel_passes_on_the_shipped_rules(installed: Installed) -> None:
    done = installed.run(str(installed.gpubot), "rules", "check")
    assert 0 == done.returncode, done.stdout + done.stderr
    assert done.stdout.startswith("OK: ")


def _get(url: str) -> tuple[int, bytes] | None:
    try:
        with OPENER.open(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()
    except OSError:
        return None


def test_demo_from_the_wheel_serves_the_page_and_the_fleet(installed: Installed) -> None:
    """`gpubot demo` replays the packaged fleet; SIGTERM stops it cleanly."""
    port = free_port()
    log = installed.outside / "demo.log"
    with log.open("wb") as out:
        demo = subprocess.Popen(  # noqa: S603 - the installed console script
            [installed.gpubot, "demo", "--port", str(port)],
            cwd=installed.outside,
            env=installed.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 45
        while (page := _get(url + "/")) is None or page[0] != 200:
            assert demo.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the page did not answer:\n" + log.read_text()
            time.sleep(0.1)
        state = _get(url + "/ui/state?as=U0ALICE01")
        assert state is not None
        assert 200 == state[0]
        nodes = [
            n["name"] for pool in json.loads(state[1])["fleet"]["pools"] for n in pool["nodes"]
        ]
        assert "a100-node-01" in nodes
    finally:
        demo.send_signal(signal.SIGTERM)
        status = demo.wait(timeout=30)
    logged = log.read_text()
    assert 0 == status, logged
    assert "the simulated fleet (default.yaml)" in logged
    assert "Traceback" not in logged


def test_serve_from_the_wheel_answers_healthz_with_no_fleet_made_up(
    installed: Installed, local: LocalSlack
) -> None:
    """`gpubot serve --http` with only the Slack settings and a database: the packaged rules,
    and telemetry from NVML if this host has GPUs, else none; never the simulated fleet."""
    unset: dict[str, str | None] = {name: None for name in os.environ if name.startswith("GPUBOT_")}
    unset |= {"GPUBOT_RULES_DIR": None, "GPUBOT_TELEMETRY": None, "PYTHONPATH": None}
    unset.pop("GPUBOT_DATABASE_URL", None)
    workdir = installed.outside / "serve"
    workdir.mkdir()
    served = Served(local, workdir, env=unset, gpubot=installed.gpubot)
    assert "GPUBOT_TELEMETRY" not in served.env
    served.start()
    try:
        health = served.wait("/healthz")
    finally:
        status = served.stop()
    assert status in (0, -signal.SIGTERM)
    assert health["ok"]
    assert load_policy(read_rules_dir(DEFAULT_RULES_DIR)).revision == health["rules_revision"]
    expected = "nvml" if nvml_available() else "none"
    assert expected == health["telemetry"]
    logged = served.log_text()
    assert 1 == logged.count(f"telemetry: {expected}: ")
    assert "Traceback" not in logged
