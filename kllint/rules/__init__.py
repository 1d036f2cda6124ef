"""The rules: one module per rule (``klNNN_<name>.py``), each declaring one
``Rule`` named ``RULE``.

``RULES`` is discovered from the modules of this package, so a new rule is
one new module (and its page in the rule book, ``rules/KLNNN.md``); a module
that declares no rule, or a rule under another module's code, fails on
import instead of being skipped. ``tests/test_rule_registry.py`` holds the
modules, the registry and the pages together."""

from __future__ import annotations

import importlib
import pkgutil
import re

from kllint.rules.base import Rule

RuleInfo = Rule  # the name the reporters and the CLI know

_MODULE = re.compile(r"(kl\d{3})_\w+")


def _discover() -> dict[str, Rule]:
    found: list[Rule] = []
    for module_info in pkgutil.iter_modules(__path__):
        match = _MODULE.fullmatch(module_info.name)
        if match is None:
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        rule = getattr(module, "RULE", None)
        if not isinstance(rule, Rule):
            raise ImportError(f"{module.__name__} declares no RULE")
        if rule.code.lower() != match.group(1):
            raise ImportError(
                f"{module.__name__} declares {rule.code}, not {match.group(1).upper()}"
            )
        found.append(rule)
    return {rule.code: rule for rule in sorted(found, key=lambda r: r.code)}


RULES: dict[str, Rule] = _discover()


def lookup(code_or_name: str) -> list[Rule]:
    """Rules matched by a code, a code prefix (``KL``, ``KL00``) or a name."""
    key = code_or_name.strip()
    if not key:
        return []
    upper = key.upper()
    return [r for r in RULES.values() if r.code.startswith(upper) or r.name == key.lower()]
