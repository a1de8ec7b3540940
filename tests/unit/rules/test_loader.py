"""Loading rule files: the shipped policy loads, and each kind of mistake is reported at
file:line:col with what was expected."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rules.domain import Outcome, Subject
from rules.errors import PolicyError
from rules.loader import load_policy, revision_of
from tests.builders import default_sources


def broken(file: str, old: str, new: str) -> list[str]:
    """Load the shipped files with one edit; return the problems as file:line:col strings."""
    sources = default_sources()
    assert old in sources[file], f"fixture text not found in {file}: {old!r}"
    sources[file] = sources[file].replace(old, new, 1)
    with pytest.raises(PolicyError) as caught:
        load_policy(sources)
    return [str(p) for p in caught.value.problems]


def test_the_shipped_policy_loads_with_three_teams_and_three_pools() -> None:
    """The default policy is complete and consistent."""
    policy = load_policy(default_sources())
    assert ["nlp", "platform", "vision"] == sorted(policy.teams)
    assert {"a100": 16, "l40s": 8, "inference": 4} == {n: p.size for n, p in policy.pools.items()}
    assert policy.pools["inference"].protected
    assert timedelta(days=7) == policy.pools["l40s"].limits.max_duration
    assert timedelta(days=3) == policy.pools["a100"].limits.max_duration
    assert policy.rules_for(Subject.REQUEST)
    assert policy.rules_for(Subject.LEASE)
    assert policy.cases
    assert Outcome.ASK == policy.default.outcome
    assert "vision" == policy.team_of("U0ALICE01").name  # type: ignore[union-attr]
    assert "vision" == policy.team_of("U0VMGR001").name  # type: ignore[union-attr]
    assert policy.team_of("U0NOBODY1") is None


@pytest.mark.parametrize(
    ("setting", "half_life"),
    [("7d", timedelta(days=7)), ("36h", timedelta(hours=36)), ("0", timedelta(0))],
)
def test_fair_share_is_turned_off_by_a_zero_half_life(setting: str, half_life: timedelta) -> None:
    sources = default_sources()
    sources["limits.yaml"] = sources["limits.yaml"].replace(
        "fair_share_half_life: 7d", f"fair_share_half_life: {setting}"
    )
    assert half_life == load_policy(sources).queue.fair_share_half_life


def test_the_revision_is_the_hash_of_the_files() -> None:
    """Any change to any file changes the revision; the same files give the same revision."""
    sources = default_sources()
    changed = dict(sources, **{"limits.yaml": sources["limits.yaml"] + "\n# note\n"})
    assert revision_of(sources) == load_policy(sources).revision
    assert revision_of(sources) != revision_of(changed)


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    [
        (
            "requests.yaml",
            "when: request.gpus > limits.max_gpus_per_request",
            "when: request.gpu > limits.max_gpus_per_request",
            "requests.yaml:10:11: unknown fact `request.gpu`",
        ),
        (
            "requests.yaml",
            "when: request.gpus > limits.max_gpus_per_request",
            "when: request.gpus >> limits.max_gpus_per_request",
            "requests.yaml:10:25: expected a fact name or a constant, found `>`",
        ),
        (
            "requests.yaml",
            "request.kind == 'borrow' and request.duration > limits.max_duration",
            "request.kind == 'borrow' and request.duration > 72",
            "requests.yaml:16:40: `request.duration` is a duration but is compared with a number",
        ),
        (
            "requests.yaml",
            "  - id: too-long",
            "  - id: too-many-gpus",
            "requests.yaml:14:9: duplicate rule id 'too-many-gpus' (first in requests.yaml:8)",
        ),
        (
            "requests.yaml",
            "when: request.gpus > limits.max_gpus_per_request",
            "when: request.pool == 'h100'",
            "requests.yaml:10:27: unknown pool 'h100' (known: a100, inference, l40s)",
        ),
        (
            "requests.yaml",
            "when: request.gpus > limits.max_gpus_per_request",
            "when: user.team in ['vision', 'robotics']",
            "requests.yaml:10:35: unknown team 'robotics' (known: nlp, platform, vision)",
        ),
        (
            "pools.yaml",
            "vision:   {nominal: 8,",
            "vision:   {nominal: 7,",
            "pools.yaml:13:7: nominal quotas add up to 15 (vision 7 + nlp 6 + platform 2) but "
            "pool 'a100' has 16 GPUs; they must add up to the pool's size",
        ),
        (
            "pools.yaml",
            "      vision:   {nominal: 8,",
            "      robots:   {nominal: 8,",
            "pools.yaml:13:7: unknown team 'robots' (teams: nlp, platform, vision)",
        ),
        (
            "pools.yaml",
            "vision:   {nominal: 8,",
            "vision:   {nominal: eight,",
            "pools.yaml:13:27: pools.a100.quotas.vision.nominal: Input should be a valid integer",
        ),
        (
            "requests.yaml",
            "    then: deny\n",
            "    then: reject\n",
            "requests.yaml:11:11: `then: reject` is not a request outcome",
        ),
        (
            "limits.yaml",
            "max_duration: 3d",
            "max_duration: three days",
            "limits.yaml:4:17: limits.max_duration: expected a duration like 90m, 6h or 2d",
        ),
        (
            "limits.yaml",
            "  max_extensions: 2",
            "  max_extension: 2",
            "limits.yaml:5:3: unknown key 'max_extension'; expected one of: max_gpus_per_request",
        ),
        (
            "org.yaml",
            "managers: [U0VMGR001]",
            "managers: [victor]",
            "org.yaml:15:16: teams.vision.managers.0: 'victor' is not a Slack user id",
        ),
        (
            "org.yaml",
            "members: [U0CAROL01, U0DAVE001]",
            "members: [U0CAROL01, U0ALICE01]",
            "org.yaml:20:26: U0ALICE01 is already a member of team 'vision'",
        ),
        (
            "org.yaml",
            "  alice: U0ALICE01",
            "  root: U0ALICE01",
            "org.yaml:7:3: accounts.root: 'root' is a system account: system accounts cannot "
            "be mapped to a person",
        ),
        (
            "org.yaml",
            "  alice: U0ALICE01",
            "  systemd-network: U0ALICE01",
            "org.yaml:7:3: accounts.systemd-network: 'systemd-network' is a system account",
        ),
        (
            "org.yaml",
            "  U0BOB0001: Bob Brown",
            "  bob: Bob Brown",
            "org.yaml:33:3: names.bob: 'bob' is not a Slack user id",
        ),
        (
            "org.yaml",
            "  U0BOB0001: Bob Brown",
            '  U0BOB0001: ""',
            "org.yaml:33:14: names.U0BOB0001: String should have at least 1 character",
        ),
        (
            "requests.yaml",
            'because: "{request.gpus} GPUs is more',
            'because: "{request.gpuz} GPUs is more',
            "requests.yaml:12:16: unknown fact `request.gpuz`",
        ),
        (
            "requests.yaml",
            "rules:\n",
            "rules:\n  - id: x\n    on: request\n    when: [1\n",
            "requests.yaml:11:7: YAML: expected ',' or ']', but got ':'",
        ),
        (
            "limits.yaml",
            "not_reporting_after: 90s",
            "not_reporting_after: 10s",
            "limits.yaml:44:24: fleet.not_reporting_after: must be at least 30s",
        ),
        (
            # refused whether or not PyYAML has libyaml (which would take the tab)
            "limits.yaml",
            "memory_floor_mib: 256",
            "memory_floor_mib: 256\t# the floor",
            "limits.yaml:43:24: YAML: found character '\\t' that cannot start any token",
        ),
        (
            "limits.yaml",
            "memory_floor_mib: 256",
            "memory_floor_mb: 256",
            "limits.yaml:43:3: unknown key 'memory_floor_mb'; expected one of: "
            "memory_floor_mib, not_reporting_after",
        ),
        (
            "tests/requests.yaml",
            "    request.kind: borrow\n",
            "",
            "tests/requests.yaml:37:5: case 'a small borrow inside nominal is approved at once' "
            "lacks facts: request.kind",
        ),
    ],
)
def test_a_broken_rule_file_is_rejected_with_file_line_and_column(
    file: str, old: str, new: str, expected: str
) -> None:
    """Each mistake an admin can make names the file, line and column and what was expected."""
    problems = broken(file, old, new)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    """Two mistakes in two files are both reported, not only the first."""
    sources = default_sources()
    sources["limits.yaml"] = sources["limits.yaml"].replace("grace: 30m", "grace: soon")
    sources["pools.yaml"] = sources["pools.yaml"].replace("nominal: 8,", "nominal: 8.5,")
    with pytest.raises(PolicyError) as caught:
        load_policy(sources)
    files = {p.file for p in caught.value.problems}
    assert {"limits.yaml", "pools.yaml"} == files


def test_a_section_defined_twice_names_both_files() -> None:
    """Limits in two files are ambiguous and refused."""
    sources = dict(default_sources(), **{"extra.yaml": "limits:\n  max_extensions: 5\n"})
    with pytest.raises(PolicyError) as caught:
        load_policy(sources)
    assert ["limits.yaml:2:1: `limits` is already defined in extra.yaml"] == [
        str(p) for p in caught.value.problems
    ]


def test_yaml_1_1_words_stay_words() -> None:
    """`on: request` is a key named on, and `no`/`yes` are not booleans."""
    sources = dict(default_sources())
    sources["org.yaml"] = sources["org.yaml"].replace("alice: U0ALICE01", "no: U0ALICE01")
    policy = load_policy(sources)
    assert "U0ALICE01" == policy.accounts["no"]


def test_a_missing_section_is_named() -> None:
    """A policy without teams says so."""
    sources = {k: v for k, v in default_sources().items() if k != "org.yaml"}
    with pytest.raises(PolicyError) as caught:
        load_policy(sources)
    messages = [p.message for p in caught.value.problems]
    assert "no file defines `teams`" in messages
    assert "no file defines `admins`" in messages
