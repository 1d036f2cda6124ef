"""Every rule is declared once, registered, and has its page.

A rule is a module ``kllint/rules/klNNN_<name>.py`` declaring ``RULE``; the
registry discovers the modules, so these tests hold the three places a rule
shows up (its module, ``RULES``, its page ``rules/KLNNN.md``) together."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import kllint.rules
from kllint.rules import RULES, Rule

ROOT = Path(__file__).parent.parent
RULE_MODULES = sorted(
    m.name for m in pkgutil.iter_modules(kllint.rules.__path__) if m.name.startswith("kl")
)


def test_every_rule_module_is_registered_under_its_code() -> None:
    assert [m[:5].upper() for m in RULE_MODULES] == list(RULES)


def test_every_registered_rule_has_a_page_and_every_page_a_rule() -> None:
    pages = sorted(p.stem for p in (ROOT / "rules").glob("KL*.md"))
    assert pages == list(RULES)


def test_a_declaration_says_what_the_harness_must_measure() -> None:
    for rule in RULES.values():
        assert isinstance(rule, Rule)
        assert rule.confirms.get("sequences"), rule.code
        assert rule.name == rule.name.lower() and " " not in rule.name
        assert rule.summary.endswith(".") and "\n" not in rule.summary
        assert rule.fix_title


def test_the_registry_is_in_code_order() -> None:
    assert list(RULES) == sorted(RULES)
