"""A rules reload reads its directory itself; what it cannot read or load leaves the rules be."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bot.services import Services
from bot.services.rule_files import RulesDirError
from bot.settings import DEFAULT_RULES_DIR
from rules.errors import PolicyError
from storage import audit
from storage.audit import AuditTag
from tests.unit.bot.conftest import ADA


def _tags(services: Services) -> list[str]:
    with services.db.read() as session:
        return [row.tag for row in audit.history(session, "rules")]


def test_a_reload_reads_the_directory_it_is_given(services: Services, tmp_path: Path) -> None:
    """The files in the directory become the rules in force, audited as a reload."""
    rules = tmp_path / "rules"
    shutil.copytree(DEFAULT_RULES_DIR, rules)
    pools = rules / "pools.yaml"
    pools.write_text(pools.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    before = services.policy.revision
    policy = services.reload_rules_dir(ADA, rules)
    assert before != policy.revision
    assert policy.revision == services.policy.revision
    assert [AuditTag.RULES_RELOADED] == _tags(services)


def test_a_directory_without_rule_files_keeps_the_rules_in_force(
    services: Services, tmp_path: Path
) -> None:
    """Nothing to read is refused before anything is loaded (and nothing is audited)."""
    before = services.policy.revision
    with pytest.raises(RulesDirError):
        services.reload_rules_dir(ADA, tmp_path)
    assert before == services.policy.revision
    assert [] == _tags(services)


def test_a_broken_rule_file_is_rejected_and_audited(services: Services, tmp_path: Path) -> None:
    """Files that do not load are refused, the old rules stay, and the refusal is recorded."""
    (tmp_path / "pools.yaml").write_text("pools: [", encoding="utf-8")
    before = services.policy.revision
    with pytest.raises(PolicyError):
        services.reload_rules_dir(ADA, tmp_path)
    assert before == services.policy.revision
    assert [AuditTag.RULES_REJECTED] == _tags(services)
