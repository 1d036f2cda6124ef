"""Each rule page is honest: its Example is flagged by exactly that rule, its
Use-instead is clean, and the harness gives the verdict the page states."""

from __future__ import annotations

import re

import pytest

from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns
from kllint.driver import check_source
from kllint.rulebook import find_rule_page, parse_sections
from kllint.rules import RULES

CODES = sorted(RULES)


def snippet(code: str, section: str) -> str:
    page = find_rule_page(code)
    assert page is not None, f"rules/{code}.md is missing"
    block = re.search(r"```python\n(.*?)```", parse_sections(page)[section], re.DOTALL)
    assert block is not None, f"{code}: no python block under {section}"
    return block.group(1)


def lint(code: str, section: str):  # type: ignore[no-untyped-def]
    return check_source(snippet(code, section), f"{code}.py", Project([]), RolePatterns())


@pytest.mark.parametrize("code", CODES)
def test_example_is_flagged_by_exactly_this_rule(code: str) -> None:
    findings = lint(code, "Example")
    assert findings, f"{code}'s Example is not flagged"
    allowed = {code, "KL003"} if code == "KL002" else {code}
    assert {f.code for f in findings} <= allowed, [f.message for f in findings]


@pytest.mark.parametrize("code", CODES)
def test_use_instead_is_clean(code: str) -> None:
    findings = lint(code, "Use instead")
    assert not findings, [f"{f.code}: {f.message}" for f in findings]


@pytest.mark.parametrize("code", CODES)
def test_page_states_the_harness_verdict(code: str) -> None:
    pytest.importorskip("torch")
    from kllint.harness import confirm_site

    page = parse_sections(find_rule_page(code) or "")["How it is confirmed"]
    stated = dict(re.findall(r"Example verdict \((sequences|one action)\): ([\w-]+)", page))
    assert stated, f"{code}: the page states no Example verdict"
    finding = next(f for f in lint(code, "Example") if f.code == code)
    assert finding.site is not None
    instances = confirm_site(finding.site).to_dict()["instances"]
    measured = {
        "sequences": instances["sequences"]["verdict"],
        "one action": instances["bandit"]["verdict"],
    }
    for setting, verdict in stated.items():
        assert measured[setting] == verdict, (
            f"{code} ({setting}): page says {verdict}, harness says {measured[setting]}"
        )
