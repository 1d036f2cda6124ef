"""Which tensor is the policy, the reference, the behaviour policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RolePatterns:
    policy: tuple[str, ...] = ()
    reference: tuple[str, ...] = ()
    old: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any]) -> RolePatterns:
        """``mapping`` is the ``[tool.kllint.roles]`` table: keys ``policy``,
        ``reference``, ``old``, each a list of regular expressions matched
        against names, attributes and dict keys (added to the built-in ones).
        Raises ``ValueError`` with a readable message on an unknown key or a
        bad pattern."""
        return cls()
