"""The results cache: a re-run only analyses what changed.

A file's entry holds its findings (or its syntax error), its suppression
comments, and the content hash of the file and of every file its analysis
read: helpers it calls in other modules, the package files scanned for
configuration defaults, YAML. The entry is used only while all of those
hashes still match, so an edit to a helper re-analyses exactly the files
that used it.

The cache lives under ``.kllint_cache/`` in the project root (the directory
of the configuration file, else the working directory) or
``$KLLINT_CACHE_DIR``, in a folder per kllint version, kllint source and
settings (changing any of them starts afresh), as one index file: a warm run
reads one file, not one per linted file.

Content hashes are remembered with the file's status (size, mtime, ctime,
inode): a file whose status is unchanged is not read again. Any write
changes the ctime, which no tool can set back, so a content change is always
seen; a file modified within two seconds of being hashed is not remembered
(timestamps are coarse on some file systems, and a second write in the same
tick would keep the status).

Concurrent runs: the index is rewritten whole, to a temporary file renamed
into place, under an advisory lock while it is merged with what other runs
wrote meanwhile; a reader never sees half an index. An index that cannot be
read is ignored and rebuilt. JSON, not pickle: a cache checked out with a
repository must not be able to run code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kllint import __version__
from kllint.findings import FileError, Finding
from kllint.suppression import SuppressionComment

if TYPE_CHECKING:
    from kllint.config import Settings

CACHE_DIR_NAME = ".kllint_cache"
INDEX_NAME = "index.json"
_FORMAT = 3
# A file modified this recently is hashed on every run: its status may not
# change on a second write within the same timestamp tick.
_RACY_S = 2.0
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
    # The file's suppression comments; None when it has none.
    comments: list[SuppressionComment] | None = None


class Cache:
    def __init__(self, directory: Path, settings: Settings) -> None:
        self.root = directory
        self.directory = directory / f"v{_FORMAT}-{_fingerprint(settings)}"
        self._index: dict[str, Any] | None = None
        self._files: dict[str, list[Any]] = {}  # path -> [size, mtime_ns, ctime_ns, inode, hash]
        self._entries: dict[str, dict[str, Any]] = {}
        # Sets of dependencies, shared by the entries that read the same files
        # (a package's helpers and config): each is checked once per run.
        self._depsets: dict[str, dict[str, Any]] = {}
        self._valid: dict[str, bool] = {}
        self._written: set[str] = set()  # entries and files this run added
        self._hashes: dict[str, str | None] = {}
        self._now = time.time()

    @classmethod
    def for_settings(cls, settings: Settings) -> Cache:
        configured = os.environ.get("KLLINT_CACHE_DIR")
        return cls(Path(configured) if configured else settings.root / CACHE_DIR_NAME, settings)

    # ------------------------------------------------------------ reading

    def known_hash(self, path: str) -> str | None:
        """The content hash of ``path`` if its status is the one recorded
        with it, without reading the file; else None."""
        self._load()
        record = self._files.get(path)
        if record is None:
            return None
        try:
            status = os.stat(path)
        except OSError:
            return None
        if record[:4] != _status_key(status):
            return None
        return str(record[4])

    def get(self, path: Path, shown: str, digest: str) -> Entry | None:
        self._load()
        try:
            data = self._entries.get(_entry_key(path, shown))
            if data is None or data["digest"] != digest or data["shown"] != shown:
                return None
            if not self._unchanged(data["deps"]):
                return None
            findings = [Finding(**item) for item in data["findings"]]
            error = FileError(**data["error"]) if data["error"] is not None else None
            comments = data["comments"]
            if comments is not None:
                comments = [
                    SuppressionComment(
                        line, column, kind, None if names is None else frozenset(names)
                    )
                    for line, column, kind, names in comments
                ]
            return Entry(findings, error, bool(data["checked"]), comments)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # a corrupt entry: analysed again and rewritten

    def _unchanged(self, depset: str) -> bool:
        if depset not in self._valid:
            dependencies = self._depsets.get(depset)
            self._valid[depset] = isinstance(dependencies, dict) and all(
                self.hash_of(path) == expected for path, expected in dependencies.items()
            )
        return self._valid[depset]

    def hash_of(self, path: str) -> str | None:
        """The content hash of ``path`` (None when it cannot be read), once per run."""
        if path not in self._hashes:
            known = self.known_hash(path)
            if known is None:
                try:
                    status = os.stat(path)
                    with open(path, "rb") as f:
                        known = content_hash(f.read())
                except OSError:
                    known = None
                else:
                    self.remember(path, status, known)
            self._hashes[path] = known
        return self._hashes[path]

    # ------------------------------------------------------------ writing

    def remember(self, path: str, status: os.stat_result, digest: str) -> None:
        """That ``path``, with the status taken before it was read, holds
        ``digest``."""
        self._load()
        self._hashes[path] = digest
        if self._now - status.st_mtime < _RACY_S:
            self._files.pop(path, None)
            return
        record = [*_status_key(status), digest]
        if self._files.get(path) != record:
            self._files[path] = record
            self._written.add("file\0" + path)

    def put(
        self, path: Path, shown: str, digest: str, dependencies: Iterable[str], entry: Entry
    ) -> None:
        self._load()
        key = _entry_key(path, shown)
        # The file itself may be among them (its hash is in ``digest`` too):
        # kept, so that the files of one package share one set.
        read = {d: self.hash_of(d) for d in sorted(set(dependencies))}
        depset = hashlib.blake2b(json.dumps(read).encode(), digest_size=12).hexdigest()
        self._depsets[depset] = read
        self._entries[key] = {
            "shown": shown,
            "digest": digest,
            "deps": depset,
            "findings": [
                json.loads(
                    json.dumps({k: getattr(f, k) for k in _FINDING_FIELDS}, default=_jsonable)
                )
                for f in entry.findings
            ],
            "error": dataclasses.asdict(entry.error) if entry.error is not None else None,
            "checked": entry.checked,
            "comments": None
            if entry.comments is None
            else [
                [c.line, c.column, c.kind, None if c.names is None else sorted(c.names)]
                for c in entry.comments
            ],
        }
        self._written.add("entry\0" + key)

    def save(self) -> None:
        """Write what this run added, merged with what other runs wrote
        meanwhile. A read-only checkout or a full disk: nothing is kept."""
        if not self._written:
            return
        with contextlib.suppress(OSError, TypeError, ValueError):
            self._prepare()
            with _locked(self.directory / ".lock"):
                current = _read_index(self.directory / INDEX_NAME)
                files, depsets, entries = current["files"], current["depsets"], current["entries"]
                for item in self._written:
                    kind, key = item.split("\0", 1)
                    if kind == "file" and key in self._files:
                        files[key] = self._files[key]
                    elif kind == "entry":
                        entries[key] = self._entries[key]
                        depsets[entries[key]["deps"]] = self._depsets[entries[key]["deps"]]
                # Dependency sets no entry uses any more (after edits) are dropped.
                used = {entry.get("deps") for entry in entries.values()}
                depsets = {k: v for k, v in depsets.items() if k in used}
                text = json.dumps(
                    {"format": _FORMAT, "files": files, "depsets": depsets, "entries": entries}
                )
                fd, temporary = tempfile.mkstemp(
                    dir=self.directory, prefix=".index-", suffix=".tmp"
                )
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as f:
                        f.write(text)
                    os.replace(temporary, self.directory / INDEX_NAME)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(temporary)
                    raise
            self._written.clear()

    # ------------------------------------------------------------ internals

    def _load(self) -> None:
        if self._index is None:
            self._index = _read_index(self.directory / INDEX_NAME)
            self._files = self._index["files"]
            self._depsets = self._index["depsets"]
            self._entries = self._index["entries"]

    def _prepare(self) -> None:
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


def _status_key(status: os.stat_result) -> list[int]:
    return [status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino]


def _entry_key(path: Path, shown: str) -> str:
    return f"{os.path.abspath(path)}\0{shown}"


def _read_index(path: Path) -> dict[str, Any]:
    """The index at ``path``; an empty one when it is missing or cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if (
            data.get("format") == _FORMAT
            and isinstance(data.get("files"), dict)
            and isinstance(data.get("entries"), dict)
            and isinstance(data.get("depsets"), dict)
            and all(isinstance(v, list) and len(v) == 5 for v in data["files"].values())
            and all(isinstance(v, dict) for v in data["entries"].values())
        ):
            return data
    except (OSError, ValueError, AttributeError):
        pass
    return {"format": _FORMAT, "files": {}, "depsets": {}, "entries": {}}


@contextlib.contextmanager
def _locked(path: Path) -> Any:
    """An advisory lock between kllint runs (where the OS has one): the
    index is read, merged and replaced by one run at a time."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX: the rename alone
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def settings_hash(value: Any) -> str:
    """A stable hash of settings (or a part of them, such as the roles)."""
    return hashlib.blake2b(_canonical(value).encode(), digest_size=8).hexdigest()


def _fingerprint(settings: Settings) -> str:
    """kllint's version, its source files (a development checkout changes
    without a new version) and the settings."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{__version__}\0{_canonical(settings)}\0".encode())
    package = Path(__file__).parent
    for directory, subdirs, files in os.walk(package):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                with contextlib.suppress(OSError):
                    stat = os.stat(os.path.join(directory, name))
                    where = os.path.relpath(os.path.join(directory, name), package)
                    digest.update(f"{where}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
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
