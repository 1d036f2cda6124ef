"""Which files a run lints.

A named file is linted whatever its suffix, unless ``--force-exclude`` asks
for ``exclude`` and ``.gitignore`` to apply to it too (pre-commit names every
staged file, so its hook passes that flag). A directory contributes its
``.py`` and ``.ipynb`` files minus hidden, build and virtualenv directories,
``exclude``, and what ``.gitignore`` ignores. Each path is judged by the
settings of its own nearest config file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kllint.config import Settings
from kllint.findings import FileError
from kllint.notebook import SUFFIX as NOTEBOOK_SUFFIX

if TYPE_CHECKING:
    import pathspec

# Never descended into (besides hidden directories); a path named on the
# command line is linted even when it is one of these.
SKIPPED_DIRS = frozenset({"__pycache__", "venv", "build", "dist", "node_modules", "site-packages"})
SUFFIXES = (".py", NOTEBOOK_SUFFIX)


def discover(
    paths: Sequence[Path], settings: Settings, errors: list[FileError] | None = None
) -> Iterator[Path]:
    """The files to lint, in a stable order. A directory that cannot be
    listed is added to ``errors`` (when given), and the walk goes on."""
    gitignore = GitIgnore()

    def unreadable(err: OSError) -> None:
        if errors is not None:
            where = Path(err.filename).as_posix() if err.filename else "?"
            errors.append(FileError(where, 1, 1, f"cannot read directory: {err.strerror or err}"))

    # Per directory: its settings (every file of a directory has the same
    # config file) and whether it is inside a git work tree.
    by_directory: dict[Path, tuple[Settings, bool]] = {}

    def skipped(path: Path, is_dir: bool) -> bool:
        directory = path if is_dir else path.parent
        known = by_directory.get(directory)
        if known is None:
            known = by_directory[directory] = (
                settings.for_path(directory),
                gitignore.in_work_tree(directory),
            )
        here, in_work_tree = known
        return here.is_excluded(path) or (
            here.respect_gitignore and in_work_tree and gitignore.ignores(path, is_dir)
        )

    for path in paths:
        if not path.is_dir():
            if not (settings.force_exclude and skipped(path, is_dir=False)):
                yield path
            continue
        if settings.force_exclude and path != Path(".") and skipped(path, is_dir=True):
            continue
        for directory, subdirs, files in os.walk(path, onerror=unreadable):
            here = Path(directory)
            subdirs[:] = sorted(
                d
                for d in subdirs
                if not d.startswith(".")
                and d not in SKIPPED_DIRS
                and not (here / d / "pyvenv.cfg").exists()
                and not skipped(here / d, is_dir=True)
            )
            for name in sorted(files):
                # Regular files only: a FIFO named ``x.py`` would block the read forever.
                if (
                    name.endswith(SUFFIXES)
                    and _is_regular(os.path.join(directory, name))
                    and not skipped(here / name, is_dir=False)
                ):
                    yield here / name


def _is_regular(path: str | Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class GitIgnore:
    """``.gitignore`` as git reads it inside a work tree: the files of every
    directory from the repository root down, and ``.git/info/exclude``.
    Outside a git work tree nothing is ignored, as with git and ripgrep.
    (Simplified: a deeper file's ``!pattern`` cannot re-include what a
    shallower file ignores.)"""

    def __init__(self) -> None:
        self._specs: dict[Path, pathspec.PathSpec | None] = {}
        self._roots: dict[Path, Path | None] = {}

    def ignores(self, path: Path, is_dir: bool) -> bool:
        path = Path(os.path.abspath(path))
        root = self._root(path.parent)
        if root is None:
            return False
        directory = path.parent
        while True:
            spec = self._spec(directory, root)
            if spec is not None:
                relative = path.relative_to(directory).as_posix() + ("/" if is_dir else "")
                if spec.match_file(relative):
                    return True
            if directory == root:
                return False
            directory = directory.parent

    def in_work_tree(self, directory: Path) -> bool:
        return self._root(Path(os.path.abspath(directory))) is not None

    def _root(self, directory: Path) -> Path | None:
        if directory not in self._roots:
            if (directory / ".git").exists():
                self._roots[directory] = directory
            elif directory.parent == directory:
                self._roots[directory] = None
            else:
                self._roots[directory] = self._root(directory.parent)
        return self._roots[directory]

    def _spec(self, directory: Path, root: Path) -> pathspec.PathSpec | None:
        if directory not in self._specs:
            lines: list[str] = []
            sources = [directory / ".gitignore"]
            if directory == root:
                sources.append(root / ".git" / "info" / "exclude")
            for source in sources:
                try:
                    lines += source.read_text(encoding="utf-8", errors="replace").splitlines()
                except OSError:
                    continue  # absent or unreadable: ignores nothing
            if lines:
                import pathspec  # only where there is a .gitignore to read

                self._specs[directory] = pathspec.GitIgnoreSpec.from_lines(lines)
            else:
                self._specs[directory] = None
        return self._specs[directory]
