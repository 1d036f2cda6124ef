"""The project index: which modules exist, parsed lazily, for helpers across files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class Project:
    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [Path(r) for r in roots]
