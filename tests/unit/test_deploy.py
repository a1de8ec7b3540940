"""The files in deploy/ parse and stay in step with the code: the settings the bot reads, the
`gpubot` console script and its commands, and a rules ConfigMap the bot accepts. Each says where
GPU samples come from, none runs the demo's simulated fleet, and the systemd units reach NVML."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from bot.cli.app import app
from bot.services.rule_files import read_rules_dir
from bot.settings import DEFAULT_RULES_DIR, Settings
from rules.engine.live import build_engine, check
from rules.loader import load_policy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENV_EXAMPLE = DEPLOY / "gpubot.env.example"
DOCKERFILE = DEPLOY / "Dockerfile"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
SLACK_NAMES = {"SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN", "SLACK_API_URL"}
# `NAME=value`, set or commented out (a commented setting keeps its default).
ASSIGNMENT = re.compile(r"^(?P<off>#\s*)?(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")


def settings_env_names() -> set[str]:
    """The environment variable of every Settings field: its alias, or the GPUBOT_ prefixed name."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return {
        field.alias if field.alias else f"{prefix}{name}".upper()
        for name, field in Settings.model_fields.items()
    }


def env_example() -> list[tuple[str, str, bool]]:
    """(name, value, active) for every assignment line of the example env file."""
    found = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = ASSIGNMENT.match(line.strip())
        if match:
            found.append((match["name"], match["value"], match["off"] is None))
    return found


def cli_command(*path: str) -> Any:
    """The click command behind `gpubot PATH...` (typer builds it; a group has `.commands`)."""
    command: Any = typer.main.get_command(app)
    for name in path:
        found = getattr(command, "commands", {}).get(name)
        assert found is not None, f"`gpubot {' '.join(path)}` does not exist"
        command = found
    return command


def has_command(name: str) -> bool:
    return name in getattr(typer.main.get_command(app), "commands", {})


def options_of(command: Any) -> set[str]:
    return {opt for param in command.params for opt in param.opts}


def assert_real_command(argv: list[str]) -> None:
    """argv[0] is the `gpubot` script; the subcommand exists and takes every option given."""
    assert Path(argv[0]).name == "gpubot", argv
    words = [w for w in argv[1:] if not w.startswith("-")]
    path = words[:2] if words[:1] == ["db"] else words[:1]
    command = cli_command(*path)
    given = {w.split("=", 1)[0] for w in argv[1:] if w.startswith("--")}
    assert given <= options_of(command), f"{argv}: unknown options {given - options_of(command)}"


def test_pyproject_installs_the_gpubot_console_script() -> None:
    """Every deploy file runs `gpubot`; pyproject.toml is what installs it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "bot.cli.app:main" == scripts["gpubot"]


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_in_deploy_parses(path: Path) -> None:
    """Each YAML file loads with safe_load_all into at least one mapping."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert documents
    assert all(isinstance(d, dict) for d in documents)


def test_yaml_files_include_compose_and_kubernetes() -> None:
    """The parse test above cannot pass vacuously."""
    names = {p.relative_to(DEPLOY).as_posix() for p in YAML_FILES}
    assert {"compose.yaml", "kubernetes/deployment.yaml", "kubernetes/service.yaml"} <= names


def test_env_example_names_exactly_the_settings_and_slacks_variables() -> None:
    """A setting added to bot/settings.py must be documented in the example, and vice versa."""
    names = [name for name, _, _ in env_example()]
    assert len(names) == len(set(names)), "a variable appears twice"
    assert SLACK_NAMES <= settings_env_names()
    expected = settings_env_names() | SLACK_NAMES
    missing, unknown = sorted(expected - set(names)), sorted(set(names) - expected)
    assert not missing, f"deploy/gpubot.env.example does not document {missing}"
    assert not unknown, f"deploy/gpubot.env.example names {unknown}, which no setting reads"


def test_env_example_sets_no_empty_values() -> None:
    """Every active line has a value: an empty one would read as something left to fill in."""
    assert all(value.strip() for _, value, active in env_example() if active)


def test_env_example_values_are_accepted_by_settings() -> None:
    """The placeholders are valid values for Settings (e.g. the engine name)."""
    active = {name: value for name, value, on in env_example() if on}
    by_env = {
        (field.alias or f"GPUBOT_{name}".upper()): name
        for name, field in Settings.model_fields.items()
    }
    values: dict[str, Any] = {}
    for env, value in active.items():
        field = Settings.model_fields[by_env[env]]
        values[field.alias or by_env[env]] = value
    Settings(_env_file=None, **values)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_builds_on_python_311_slim_in_two_stages() -> None:
    """A builder with build-essential for durable-rules' C core; the runtime copies its wheels."""
    instructions = dockerfile_instructions()
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert ["python:3.11-slim AS builder", "python:3.11-slim"] == froms
    runs = " ".join(args for keyword, args in instructions if keyword == "RUN")
    assert "build-essential" in runs
    assert "from=builder" in runs


def test_dockerfile_runs_gpubot_serve_as_a_non_root_user_with_a_health_check() -> None:
    """CMD is a real `gpubot serve` command line; USER is not root; HEALTHCHECK asks /healthz."""
    instructions = dict(dockerfile_instructions())
    assert instructions["USER"] not in ("root", "0")
    assert_real_command(yaml.safe_load(instructions["CMD"]))  # a JSON array is YAML
    assert "serve" in instructions["CMD"]
    assert "/healthz" in instructions["HEALTHCHECK"]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def test_compose_runs_the_bot_on_postgres_16_after_a_one_shot_upgrade() -> None:
    """The bot's database URL names the postgres service; `migrate` runs `gpubot db upgrade`."""
    services = compose()["services"]
    assert "postgres:16" == services["postgres"]["image"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    for name in ("migrate", "gpubot"):
        service = services[name]
        assert "gpubot.env" == service["env_file"]
        assert "@postgres:5432/" in service["environment"]["GPUBOT_DATABASE_URL"]
        assert_real_command(service["command"])
    assert ["gpubot", "db", "upgrade"] == services["migrate"]["command"]
    depends = services["gpubot"]["depends_on"]
    assert "service_completed_successfully" == depends["migrate"]["condition"]


def test_compose_can_scale_the_bot() -> None:
    """`docker compose up --scale gpubot=2`: no fixed container name, and a range of host
    ports, one for each replica, instead of one port two replicas would both ask for."""
    bot = compose()["services"]["gpubot"]
    assert "container_name" not in bot
    (published,) = bot["ports"]
    low, high = published.split(":")[1].split("-")
    assert int(high) - int(low) >= 1


def kubernetes() -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes object in deploy/kubernetes by (kind, name)."""
    objects = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc and "metadata" in doc:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def test_kubernetes_deployment_runs_two_gpubots_with_health_probes() -> None:
    """Two replicas, rolled without ever having none ready, one kept through drains by the
    PodDisruptionBudget; ready when the database takes writes, alive while the process answers
    (a database outage never restarts it); containers run real commands."""
    objects = kubernetes()
    spec = objects[("Deployment", "gpubot")]["spec"]
    assert 2 == spec["replicas"]
    assert "RollingUpdate" == spec["strategy"]["type"]
    assert 0 == spec["strategy"]["rollingUpdate"]["maxUnavailable"]
    budget = objects[("PodDisruptionBudget", "gpubot")]["spec"]
    assert 1 == budget["minAvailable"]
    assert spec["selector"] == budget["selector"]
    kustomized = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    assert "pdb.yaml" in kustomized["resources"]
    pod = spec["template"]["spec"]
    (main,) = pod["containers"]
    assert_real_command(main["command"])
    assert "/readyz" == main["readinessProbe"]["httpGet"]["path"]
    assert "/livez" == main["livenessProbe"]["httpGet"]["path"]
    (init,) = pod["initContainers"]
    script = init["command"][-1]
    assert "gpubot rules check /etc/gpubot/rules" in script
    assert_real_command(shlex.split(script.split("&&")[-1]))
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_kubernetes_service_and_secret_template_match_the_deployment() -> None:
    """The Service selects the pod; the Secret template holds the variables the pod needs."""
    objects = kubernetes()
    deployment = objects[("Deployment", "gpubot")]["spec"]
    service = objects[("Service", "gpubot")]["spec"]
    assert deployment["selector"]["matchLabels"] == service["selector"]
    secret = objects[("Secret", "gpubot")]["stringData"]
    assert {"SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "GPUBOT_DATABASE_URL"} == set(secret)


def test_kubernetes_rules_configmaps_hold_rules_the_bot_accepts() -> None:
    """The rule files and their cases, laid out as the init container does, load and pass."""
    objects = kubernetes()
    sources = dict(objects[("ConfigMap", "gpubot-rules")]["data"])
    tests = objects[("ConfigMap", "gpubot-rule-tests")]["data"]
    sources.update({f"tests/{name}": text for name, text in tests.items()})
    assert read_rules_dir(DEFAULT_RULES_DIR) == sources, (
        "deploy/kubernetes/rules-configmap.yaml no longer holds the shipped rules; remake it "
        "as its header says"
    )
    policy = load_policy(sources)
    assert policy.cases
    engine = build_engine(policy, "reference")
    try:
        check(policy, engine)
    finally:
        engine.close()


def unit_directives(path: Path) -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", ";", "[")):
            directives.setdefault(key.strip(), []).append(value.strip())
    return directives


def test_systemd_units_exist() -> None:
    """The unit tests below cannot pass vacuously."""
    assert {"gpubot.service", "gpubot-agent.service"} == {p.name for p in UNITS}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_units_run_the_gpubot_console_script_as_a_service_user(unit: Path) -> None:
    """ExecStart runs `gpubot`, never as root."""
    directives = unit_directives(unit)
    starts = directives.get("ExecStartPre", []) + directives["ExecStart"]
    for line in starts:
        assert "gpubot" == Path(shlex.split(line)[0]).name
    assert directives["User"][0] not in ("root", "0")


def test_systemd_bot_unit_runs_real_commands() -> None:
    """The bot unit's `db upgrade` and `serve` exist with the options it passes."""
    directives = unit_directives(DEPLOY / "systemd" / "gpubot.service")
    for line in directives["ExecStartPre"] + directives["ExecStart"]:
        assert_real_command(shlex.split(line))


def test_systemd_agent_unit_runs_the_agent_with_a_bot_url_and_a_token_file() -> None:
    """The node agent: `gpubot agent --bot-url URL --token-file /etc/gpubot/agent.token`."""
    (line,) = unit_directives(DEPLOY / "systemd" / "gpubot-agent.service")["ExecStart"]
    argv = shlex.split(line)
    assert "agent" == argv[1]
    assert "/etc/gpubot/agent.token" == argv[argv.index("--token-file") + 1]
    assert "--bot-url" in argv
    if has_command("agent"):  # the agent command is newer than this unit
        assert_real_command(argv)


def telemetry_settings() -> dict[str, str]:
    """GPUBOT_TELEMETRY as each deploy file that runs the bot sets it."""
    dockerfile: dict[str, str] = {}
    for keyword, args in dockerfile_instructions():
        if keyword == "ENV":
            dockerfile |= dict(word.split("=", 1) for word in shlex.split(args))
    container = kubernetes()[("Deployment", "gpubot")]["spec"]["template"]["spec"]["containers"][0]
    unit = unit_directives(DEPLOY / "systemd" / "gpubot.service")
    environment = dict(line.split("=", 1) for line in unit.get("Environment", []))
    return {
        "Dockerfile": dockerfile.get("GPUBOT_TELEMETRY", ""),
        "compose.yaml": compose()["services"]["gpubot"]["environment"].get("GPUBOT_TELEMETRY", ""),
        "kubernetes/deployment.yaml": {e["name"]: e.get("value") for e in container["env"]}.get(
            "GPUBOT_TELEMETRY", ""
        ),
        "systemd/gpubot.service": environment.get("GPUBOT_TELEMETRY", ""),
    }


def test_every_deploy_file_names_a_real_telemetry_source() -> None:
    """Each way of running the bot says where its samples come from: node agents where the bot
    runs in a container without GPUs, this host's NVML (or agents) under systemd."""
    expected = {
        "Dockerfile": "agents",
        "compose.yaml": "agents",
        "kubernetes/deployment.yaml": "agents",
        "systemd/gpubot.service": "auto",
    }
    assert expected == telemetry_settings()
    for value in expected.values():
        Settings(_env_file=None, telemetry=value)


def test_no_deploy_file_runs_the_simulated_fleet() -> None:
    """The simulated fleet is the demo's: no deploy file asks for it, even commented out."""
    asked = re.compile(r"GPUBOT_TELEMETRY\W+simulated|GPUBOT_FLEET\s*[=:]\s*\S|--simulated")
    files = [p for p in DEPLOY.rglob("*") if p.is_file()]
    assert DOCKERFILE in files
    offenders = [
        f"{path.relative_to(DEPLOY)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asked.search(line) and not line.lstrip().startswith("#")
    ]
    assert [] == offenders
    assert "simulated" not in telemetry_settings().values()
    example = {name: value for name, value, active in env_example() if active}
    assert example.get("GPUBOT_TELEMETRY", "auto") != "simulated"


# What NVML opens: /dev/nvidiactl, /dev/nvidia0..N and /dev/nvidia-uvm, by path or by the device
# group systemd reads from /proc/devices.
NVML_DEVICES = (
    ("/dev/nvidiactl", "char-nvidiactl"),
    ("/dev/nvidia0", "char-nvidia-frontend"),
    ("/dev/nvidia-uvm", "char-nvidia-uvm"),
)


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_units_can_reach_nvml(unit: Path) -> None:
    """PrivateDevices=yes would hide /dev/nvidia*; a device allow-list must name NVML's."""
    directives = unit_directives(unit)
    assert directives.get("PrivateDevices", ["no"])[-1] in ("no", "false", "0")
    policy = directives.get("DevicePolicy", ["auto"])[-1]
    allowed = directives.get("DeviceAllow", [])
    if policy != "auto" or allowed:
        granted = set()
        for entry in allowed:
            device, *access = entry.split()
            if "w" in (access or ["rwm"])[0]:  # no access given means rwm
                granted.add(device)
        for path, group in NVML_DEVICES:
            assert path in granted or group in granted, f"{unit.name}: {path} is not allowed"


def test_systemd_bot_unit_keeps_its_sandbox() -> None:
    """Reaching the GPUs costs no other hardening."""
    directives = unit_directives(DEPLOY / "systemd" / "gpubot.service")
    assert "closed" == directives["DevicePolicy"][-1]
    assert [""] == directives["CapabilityBoundingSet"]
    for name, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
    }.items():
        assert [value] == directives[name], name
