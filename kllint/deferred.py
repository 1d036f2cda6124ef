"""A module imported when it is first used, not when it is first imported.

The analysis modules import LibCST at their top (for annotations and
``isinstance`` checks), and the configuration, the rules and the reporters
import the analysis's vocabulary. A run answered entirely from the cache
never parses a file, and LibCST's import alone (~0.2 s) would be most of it.
Importing this module puts a stand-in for LibCST in ``sys.modules``:
``import libcst`` binds the stand-in, and the first attribute read on it
(``cst.Name``, ``libcst.parse_module``, ``from libcst.metadata import ...``)
imports the real module and copies its namespace into the stand-in, so
later reads are plain attribute reads."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _OnFirstUse(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        # Only called for names the stand-in does not hold yet.
        real = self._load()
        return getattr(real, name)

    def _load(self) -> types.ModuleType:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]  # so that the import machinery loads the real one
            try:
                real = importlib.import_module(name)
            except BaseException:
                sys.modules[name] = self
                raise
        else:
            real = sys.modules[name]
        namespace = {k: v for k, v in vars(real).items() if k != "__class__"}
        vars(self).update(namespace)
        return real


def import_on_first_use(name: str) -> None:
    """Defer importing ``name`` until an attribute of it is read (a no-op
    when it is already imported)."""
    if name not in sys.modules:
        sys.modules[name] = _OnFirstUse(name)


import_on_first_use("libcst")
