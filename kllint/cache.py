"""The results cache: a re-run only analyses what changed.

A file's entry holds its findings (or its syntax error) and the content hash
of the file and of every file its analysis read: helpers it calls in other
modules, the package files scanned for configuration defaults, YAML. The
entry is used only while all of those hashes still match, so an edit to a
helper re-analyses exactly the files that used it.

Entries live under ``.kllint_cache/`` in the project root (the directory of
the configuration file, else the working directory) or ``$KLLINT_CACHE_DIR``,
one JSON file per linted file, in a folder per kllint version, kllint source
and settings: changing any of them starts afresh. Writes go to a temporary
file renamed into place, so concurrent runs never see half an entry; an entry
that cannot be read is ignored and rewritten. JSON, not pickle: a cache
checked out with a repository must not be able to run code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kllint import __version__
from kllint.config import Settings
from kllint.findings import FileError, Finding

CACHE_DIR_NAME = ".kllint_cache"
_FORMAT = 1
# Not the KL sites (IR trees): they do not cross processes or runs.
_FINDING_FIELDS = [
    f.name for f in dataclasses.fields(Finding) if f.name not in ("site", "alternatives")
]


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclasses.dataclass
class Entry:
    findings: list[Finding]
    error: FileError | None
    checked: bool  # counted in ``files_checked`` (a decoded file)


class Cache:
    def __init__(self, directory: Path, settings: Settings) -> None:
        self.root = directory
        self.directory = directory / f"v{_FORMAT}-{_fingerprint(settings)}"
        self._hashes: dict[str, str | None] = {}
        self._prepared = False

    @classmethod
    def for_settings(cls, settings: Settings) -> Cache:
        configured = os.environ.get("KLLINT_CACHE_DIR")
        return cls(Path(configured) if configured else settings.root / CACHE_DIR_NAME, settings)

    def get(self, path: Path, shown: str, digest: str) -> Entry | None:
        try:
            with open(self._entry_path(path, shown), encoding="utf-8") as f:
                data = json.load(f)
            if data["digest"] != digest or data["shown"] != shown:
                return None
            for dependency, expected in data["deps"].items():
                if self.hash_of(dependency) != expected:
                    return None
            findings = [Finding(**item) for item in data["findings"]]
            error = FileError(**data["error"]) if data["error"] is not None else None
            return Entry(findings, error, bool(data["checked"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # missing or corrupt: analysed again and rewritten

    def put(
        self, path: Path, shown: str, digest: str, dependencies: Iterable[str], entry: Entry
    ) -> None:
        own = os.path.abspath(path)
        data = {
            "shown": shown,
            "digest": digest,
            "deps": {d: self.hash_of(d) for d in sorted(set(dependencies)) if d != own},
            "findings": [{k: getattr(f, k) for k in _FINDING_FIELDS} for f in entry.findings],
            "error": dataclasses.asdict(entry.error) if entry.error is not None else None,
            "checked": entry.checked,
        }
        try:
            text = json.dumps(data, default=_jsonable)
            self._prepare()
            target = self._entry_path(path, shown)
            fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".entry-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(temporary, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except (OSError, TypeError, ValueError):
            pass  # a read-only checkout or a full disk: run without caching

    def hash_of(self, path: str) -> str | None:
        """The content hash of ``path`` (None when it cannot be read), once per run."""
        if path not in self._hashes:
            try:
                with open(path, "rb") as f:
                    self._hashes[path] = content_hash(f.read())
            except OSError:
                self._hashes[path] = None
        return self._hashes[path]

    def _entry_path(self, path: Path, shown: str) -> Path:
        key = hashlib.blake2b(f"{os.path.abspath(path)}\0{shown}".encode(), digest_size=16)
        return self.directory / f"{key.hexdigest()}.json"

    def _prepare(self) -> None:
        if self._prepared:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        # Like Ruff's and pytest's caches: ignored by git, skipped by backups.
        for name, text in (
            (".gitignore", "# Created by kllint.\n*\n"),
            ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n"),
        ):
            marker = self.root / name
            if not marker.exists():
                with contextlib.suppress(OSError):
                    marker.write_text(text, encoding="utf-8")
        self._prepared = True


def settings_hash(value: Any) -> str:
    """A stable hash of settings (or a part of them, such as the roles)."""
    return hashlib.blake2b(_canonical(value).encode(), digest_size=8).hexdigest()


def _fingerprint(settings: Settings) -> str:
    """kllint's version, its source files (a development checkout changes
    without a new version) and the settings."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{__version__}\0{_canonical(settings)}\0".encode())
    package = Path(__file__).parent
    for source in sorted(package.rglob("*.py")):
        with contextlib.suppress(OSError):
            stat = source.stat()
            digest.update(
                f"{source.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}\0".encode()
            )
    return digest.hexdigest()


def _canonical(value: Any) -> str:
    """``repr`` with sets sorted: a frozenset's order changes from one process
    to the next (string hashing is randomised)."""
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_canonical(v) for v in value)) + "}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_canonical(v) for v in value) + ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = (
            f"{f.name}={_canonical(getattr(value, f.name))}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__name__}({', '.join(fields)})"
    return repr(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    from kllint.analysis import ir

    if isinstance(value, ir.Node):
        return ir.render(value)
    return str(value)
