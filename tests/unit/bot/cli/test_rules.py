"""`gpubot rules check`: a one-line summary, file:line:col problems, and one-line errors
(exit 2) instead of tracebacks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.builders import POLICIES, default_policy, permissive_sources
from tests.unit.bot.cli.builders import GPUBOT, ROOT, a_copy_of_the_rules, edit, gpubot, line_of

OK_LINE = (
    "OK: 28 rules (17 request, 9 lease, 2 gpu), 40 cases passed; "
    f"revision {default_policy().revision}; engine durable"
)


@pytest.mark.durable
def test_rules_check_passes_the_shipped_rules_with_a_one_line_summary() -> None:
    """The shipped policy loads, compiles on durable and passes every case."""
    result = gpubot("rules", "check", str(POLICIES))
    assert 0 == result.exit_code, result.output
    assert OK_LINE + "\n" == result.stdout


def test_rules_check_reads_the_directory_from_gpubot_rules_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With no DIR argument the settings' rules directory is checked."""
    copy = a_copy_of_the_rules(tmp_path)
    edit(copy / "requests.yaml", "request.gpus > limits", "request.gpu > limits")
    monkeypatch.setenv("GPUBOT_RULES_DIR", str(copy))
    result = gpubot("rules", "check")
    assert 2 == result.exit_code
    assert f"{copy}/requests.yaml:10:11: unknown fact `request.gpu`" in result.stderr


def test_rules_check_can_run_the_cases_on_the_reference_engine() -> None:
    """--engine reference overrides GPUBOT_RULES_ENGINE and is named in the summary."""
    result = gpubot("rules", "check", str(POLICIES), "--engine", "reference")
    assert 0 == result.exit_code, result.output
    assert result.stdout.rstrip().endswith("engine reference")


def test_rules_check_names_the_line_and_column_of_an_unknown_fact(tmp_path: Path) -> None:
    """A typo in a `when` exits 2 with the file under DIR, line and column, then a summary."""
    copy = a_copy_of_the_rules(tmp_path)
    edit(copy / "requests.yaml", "request.gpus > limits", "request.gpu > limits")
    result = gpubot("rules", "check", str(copy))
    assert 2 == result.exit_code
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"{copy}/requests.yaml:10:11: unknown fact `request.gpu`")
    assert result.stderr.splitlines()[-1].startswith("FAILED: ")
    assert "" == result.stdout


def test_rules_check_names_a_failing_case_and_where_it_is(tmp_path: Path) -> None:
    """A case whose expectation no longer holds exits 2 naming the case and its line."""
    copy = a_copy_of_the_rules(tmp_path)
    cases = copy / "tests" / "requests.yaml"
    edit(
        cases,
        "    facts: {request.duration: 4d}\n    expect: deny",
        "    facts: {request.duration: 4d}\n    expect: approve",
    )
    line = line_of(cases, "name: longer than the pool allows is denied")
    result = gpubot("rules", "check", str(copy))
    assert 2 == result.exit_code
    expected = (
        f"{cases}:{line}:1: case 'longer than the pool allows is denied': "
        "expected approve, got deny"
    )
    assert result.stderr.startswith(expected)
    assert "FAILED: 1 of 40 cases failed" in result.stderr


def test_rules_check_of_a_missing_directory_exits_2_without_a_traceback(tmp_path: Path) -> None:
    """A directory that is not there is one error line."""
    result = gpubot("rules", "check", str(tmp_path / "nowhere"))
    assert 2 == result.exit_code
    assert f"error: {tmp_path / 'nowhere'}: no such rules directory\n" == result.stderr


def test_an_invalid_setting_in_the_environment_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPUBOT_RULES_ENGINE=fast is refused by name, exit 2."""
    monkeypatch.setenv("GPUBOT_RULES_ENGINE", "fast")
    result = gpubot("rules", "check", str(POLICIES))
    assert 2 == result.exit_code
    assert result.stderr.startswith("error: invalid settings: GPUBOT_RULES_ENGINE: ")


@pytest.mark.durable
def test_the_installed_script_checks_the_shipped_rules() -> None:
    """The real `gpubot` console script runs `rules check` and exits 0."""
    done = subprocess.run(  # noqa: S603  (our own console script, fixed arguments)
        [str(GPUBOT), "rules", "check", "rules/policies"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (0, OK_LINE + "\n") == (done.returncode, done.stdout), done.stderr


def test_the_installed_script_points_an_editor_at_the_broken_rule(tmp_path: Path) -> None:
    """Through the real script: exit 2 and `<dir>/requests.yaml:10:11: unknown fact` on stderr."""
    copy = a_copy_of_the_rules(tmp_path)
    edit(copy / "requests.yaml", "request.gpus > limits", "request.gpu > limits")
    done = subprocess.run(  # noqa: S603  (our own console script, fixed arguments)
        [str(GPUBOT), "rules", "check", "policies"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 2 == done.returncode
    assert "policies/requests.yaml:10:11: unknown fact `request.gpu`" in done.stderr
    assert "Traceback" not in done.stderr


def test_rules_check_warns_when_the_rules_never_state_the_quota_limits(tmp_path: Path) -> None:
    """Rule files without the quota rules still pass (the code enforces the limits), with a
    warning for each limit they never look at."""
    for name, text in permissive_sources().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    result = gpubot("rules", "check", str(tmp_path), "--engine", "reference")
    assert 0 == result.exit_code, result.output
    assert result.stdout.startswith("OK: 26 rules")
    warnings = result.stderr.splitlines()
    assert 2 == len(warnings)
    assert warnings[0].startswith(f"{tmp_path}: warning: no request rule looks at the borrowing")
    assert all("the code still enforces it" in w for w in warnings)


def test_rules_check_is_quiet_about_quotas_the_shipped_rules_state() -> None:
    result = gpubot("rules", "check", str(POLICIES), "--engine", "reference")
    assert "" == result.stderr
