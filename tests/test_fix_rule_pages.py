"""The Fix section of each rule page is what ``--fix`` does: for the rules
with a rewrite, the "After" block is exactly what ``kllint --fix`` writes for
the "Before" block; for the others, the page's Example gets no fix and a reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kllint.cli import main
from kllint.config import load_settings
from kllint.engine import lint_paths
from kllint.fix import FIXABLE_CODES, fix_result
from kllint.rulebook import find_rule_page, parse_sections
from kllint.rules import RULES


def blocks(code: str, section: str) -> list[str]:
    page = find_rule_page(code)
    assert page is not None
    assert section in parse_sections(page), f"{code}: no {section} section"
    return re.findall(r"```python\n(.*?)```", parse_sections(page)[section], re.DOTALL)


@pytest.mark.parametrize("code", FIXABLE_CODES)
def test_after_is_what_fix_writes_for_before(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, after = blocks(code, "Fix")
    monkeypatch.chdir(tmp_path)
    Path("before.py").write_text(before)
    result = CliRunner().invoke(main, ["--fix", "before.py"])
    assert result.exit_code == 0, result.output
    assert Path("before.py").read_text() == after


@pytest.mark.parametrize("code", sorted(set(RULES) - set(FIXABLE_CODES)))
def test_rules_without_a_rewrite_say_so(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not blocks(code, "Fix")
    assert "No automatic fix" in parse_sections(find_rule_page(code) or "")["Fix"]
    monkeypatch.chdir(tmp_path)
    Path("example.py").write_text(blocks(code, "Example")[0])
    settings = load_settings([Path("example.py")])
    result = lint_paths([Path("example.py")], settings, jobs=1)
    fix_result(result, settings, unsafe=True)
    mine = [f for f in result.findings if f.code == code]
    assert mine
    assert all(f.fix is None and f.facts["fix_unavailable"] for f in mine)
