"""Which files a run lints: named files always, a directory's Python files
minus hidden, build and virtualenv directories and ``exclude``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from kllint.config import Settings

# Never descended into (besides hidden directories); a path named on the
# command line is linted even when it is one of these.
SKIPPED_DIRS = frozenset({"__pycache__", "venv", "build", "dist", "node_modules", "site-packages"})


def discover(paths: Sequence[Path], settings: Settings) -> Iterator[Path]:
    """The files to lint, in a stable order: a named file always, a directory's
    ``.py`` files minus hidden, build and virtualenv directories and ``exclude``."""
    for path in paths:
        if not path.is_dir():
            yield path
            continue
        for directory, subdirs, files in os.walk(path):
            here = Path(directory)
            subdirs[:] = sorted(
                d
                for d in subdirs
                if not d.startswith(".")
                and d not in SKIPPED_DIRS
                and not (here / d / "pyvenv.cfg").exists()
                and not settings.is_excluded(here / d)
            )
            for name in sorted(files):
                if name.endswith(".py") and not settings.is_excluded(here / name):
                    yield here / name
