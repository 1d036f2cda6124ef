"""One lint run: find the files, check each, keep what the settings allow.

Every file is analysed on its own: in worker processes (see ``workers``)
that a crash, a hang or a memory blow-up on one file cannot take down, with
results reused from the cache (see ``cache``) when nothing the analysis
read has changed. A file kllint cannot handle is reported (``E998``) and the
others are still linted."""

from __future__ import annotations

import ast
import gc
import io
import os
import re
import stat
import sys
import tokenize
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kllint.cache import Cache, Entry, content_hash, settings_hash
from kllint.config import Settings
from kllint.discovery import discover
from kllint.findings import FileError, Finding, LintResult
from kllint.notebook import Notebook, NotebookError, cell_key, is_notebook
from kllint.prefilter import must_analyse
from kllint.suppression import (
    SuppressionComment,
    is_suppressed,
    might_suppress,
    parse_comments,
    stale_suppressions,
    suppression_table,
)

if TYPE_CHECKING:
    import libcst

    from kllint import workers
    from kllint.analysis.project import Project

COULD_NOT_ANALYSE = "E998"
# Larger files are reported, not parsed: LibCST needs ~200 bytes of memory
# per byte of source. Generated modules of real projects stay under 2 MB.
MAX_FILE_BYTES = 4 << 20
# Deeper bracket nesting is reported, not parsed, where a crash of the native
# parser cannot be isolated (in this process). CPython itself stops at 200.
MAX_NESTING = 200


def check_source(source: str, path: str, project: Project, roles: Any) -> list[Finding]:
    """The analysis of one file. Imported on first use: LibCST and the
    analysis take longer to import than a fully cached run takes."""
    from kllint.driver import check_source as check

    return check(source, path, project, roles)


class MissingPathError(Exception):
    """A path named on the command line does not exist."""


# Below this much source to analyse per worker, another worker costs more
# (its start, its own index of the project and its own parse of the helpers
# every file calls) than it saves: about 5 s of analysis on one core.
PARALLEL_MIN_BYTES = 512 << 10


@dataclass
class _Outcome:
    """What the analysis of one file gives, in a worker or here."""

    findings: list[Finding]
    error: FileError | None = None
    internal: bool = False  # a bug in kllint, not bad input
    dependencies: list[str] = field(default_factory=list)  # files the analysis read
    cacheable: bool = True
    # The file's suppression comments, from the cache; None: read them from its text.
    comments: list[SuppressionComment] | None = None


@dataclass
class _Source:
    path: Path
    shown: str
    text: str  # the code analysed: a notebook's code cells as one module
    digest: str  # of the file's bytes and of the settings its analysis depends on
    settings: Settings  # the file's own, from its nearest config file
    notebook: Notebook | None = None
    status: os.stat_result | None = None  # taken before the file was read
    content: str = ""  # the hash of the file's bytes


def lint_paths(
    paths: Sequence[str | Path],
    settings: Settings | None = None,
    *,
    jobs: int | None = None,
    cache: Cache | None = None,
    keep_sites: bool = False,
) -> LintResult:
    """Lint files and directories. Raises ``MissingPathError`` before linting
    anything when a path does not exist.

    ``jobs``: worker processes (default: one per usable CPU). ``cache``:
    reuse and store results. ``keep_sites``: analyse in this process, so
    that findings keep their KL site (``--confirm`` needs it; IR trees do
    not cross processes), at the price of no isolation from crashes."""
    settings = settings or Settings()
    targets = [Path(p) for p in paths] or [Path(".")]
    missing = [_why_missing(p) for p in targets if not p.exists()]
    if missing:
        raise MissingPathError("; ".join(missing))

    # Imports resolve against the project root, not against whichever paths
    # were named: the same file gives the same findings however it is reached.
    roots = [settings.root]
    result = LintResult(findings=[], errors=[], files_checked=0)
    files: dict[str, Path] = {}
    for path in discover(targets, settings, result.errors):
        files.setdefault(os.path.abspath(path), path)  # `kllint . a.py` lints a.py once

    pending: list[_Source] = []

    def record(source: _Source, outcome: _Outcome) -> None:
        comments = _add(result, source, outcome)
        if cache is not None and outcome.cacheable and not outcome.internal:
            entry = Entry(outcome.findings, outcome.error, checked=True, comments=comments)
            cache.put(source.path, source.shown, source.digest, outcome.dependencies, entry)

    use_cache = cache is not None and not keep_sites
    by_directory: dict[str, Settings] = {}
    for key, path in files.items():
        directory = os.path.dirname(key)
        here = by_directory.get(directory)
        if here is None:  # the files of a directory share their config file
            here = by_directory[directory] = settings.for_path(path)
        if use_cache and _from_cache(cache, key, path, here, result):  # type: ignore[arg-type]
            continue  # unchanged, and nothing reported: not even read
        source = _read(path, here, result)
        if source is None:
            continue
        result.files_checked += 1
        hit = None
        if use_cache:
            assert cache is not None and source.status is not None
            cache.remember(key, source.status, source.content)
            hit = cache.get(path, source.shown, source.digest)
        if hit is not None:
            _add(result, source, _Outcome(hit.findings, hit.error, comments=hit.comments))
        elif not keep_sites and not _may_hold_kl(source):
            # Not parsed: it cannot hold a KL term. Recorded now, so that its
            # text is not held (nor copied into every worker) while the
            # others are analysed.
            record(source, _Outcome([]))
        else:
            pending.append(source)
    source = None  # the last file's text is not kept either

    if pending:
        # Imported here, once, before any worker is forked from this process.
        from kllint import driver  # noqa: F401
    if keep_sites:
        from kllint.analysis.project import Project

        project = Project(roots)
        for source in pending:
            record(source, _analyse_here(source, project))
    elif pending:
        _analyse_in_workers(pending, roots, jobs, record)
    if cache is not None:
        cache.save()
    _sort(result)
    return result


def _from_cache(cache: Cache, key: str, path: Path, settings: Settings, result: LintResult) -> bool:
    """Report a file from the cache without reading it, when its status is
    the one recorded with its content hash and nothing is reported in it
    (findings need the text to be shown, a notebook to be mapped to cells)."""
    if is_notebook(path):
        return False
    content = cache.known_hash(key)
    if content is None:
        return False
    shown = display_path(path)
    hit = cache.get(path, shown, f"{content}-{_roles_hash(settings)}")
    if hit is None or hit.findings or not hit.checked:
        return False
    result.files_checked += 1
    source = _Source(path, shown, "", "", settings)
    _add(result, source, _Outcome([], hit.error, comments=hit.comments))
    return True


_ROLES_HASHES: dict[int, tuple[Settings, str]] = {}


def _roles_hash(settings: Settings) -> str:
    """The hash of the roles configured for a file: they change what its
    analysis finds. Once per settings object."""
    known = _ROLES_HASHES.get(id(settings))
    if known is None or known[0] is not settings:
        known = _ROLES_HASHES[id(settings)] = (settings, settings_hash(settings.roles))
    return known[1]


def lint_source(data: bytes, filename: str, settings: Settings | None = None) -> LintResult:
    """Lint text that has no file (``kllint -``): ``filename`` places it for
    the config file, ``per-file-ignores`` and reports, and whether it is a
    notebook. Helpers it imports are still read from disk around it."""
    from kllint.analysis.project import Project

    path = Path(filename)
    settings = settings or Settings()
    result = LintResult(findings=[], errors=[], files_checked=0)
    source = _decoded(data, path, display_path(path), settings.for_path(path), result)
    if source is not None:
        result.files_checked += 1
        project = Project(list(dict.fromkeys([settings.root, Path(os.path.abspath(path)).parent])))
        _add(result, source, _analyse_here(source, project))
    _sort(result)
    return result


def _sort(result: LintResult) -> None:
    result.findings.sort(key=Finding.sort_key)
    result.errors.sort(key=lambda e: (e.path, e.cell or 0, e.line, e.column))
    result.warnings.sort(key=lambda e: (e.path, e.cell or 0, e.line, e.column))


def _add(result: LintResult, source: _Source, outcome: _Outcome) -> list[SuppressionComment]:
    """What the analysis found, as the file's settings and comments let it be
    reported; returns the file's suppression comments. Here, not in the
    worker: the cache keeps what the analysis found, so a changed ``select``
    needs no new analysis."""
    notebook = source.notebook
    if outcome.error is not None:
        result.errors.append(notebook.relocate(outcome.error) if notebook else outcome.error)
        result.internal_errors += outcome.internal
    settings = source.settings
    enabled = settings.select - settings.ignored_codes(source.path)
    findings = [f for f in outcome.findings if f.code in enabled]
    warnings: list[FileError] = []
    comments = outcome.comments
    if comments is None:
        suppressing = might_suppress(source.text, bool(outcome.findings))
        comments = parse_comments(source.text) if suppressing else []
    if comments:
        warnings = stale_suppressions(comments, findings, enabled, source.shown)
        suppressions = suppression_table(comments)
        findings = [f for f in findings if not is_suppressed(f, suppressions)]
    if notebook is not None:
        findings = [notebook.relocate(f) for f in findings]
        warnings = [notebook.relocate(w) for w in warnings]
        for cell in {f.cell for f in findings if f.cell is not None}:
            result.sources[cell_key(source.shown, cell)] = notebook.cell_code(cell)
    elif findings:
        result.sources[source.shown] = source.text
    result.findings.extend(findings)
    result.warnings.extend(warnings)
    return comments


def worker_count(work_bytes: int, jobs: int | None) -> int:
    """Never more workers than usable CPUs (cgroup quota included), nor than
    the source to analyse keeps busy: a small tree stays in one worker.
    Not fewer on a busy machine: the load average counts the previous
    run's own workers (a hook after a hook), and measured side by side two
    workers were never slower than one there."""
    from kllint import workers  # multiprocessing: imported only when something is analysed

    cpus = workers.usable_cpus()
    return max(1, min(jobs or cpus, cpus, work_bytes // PARALLEL_MIN_BYTES))


def _analyse_in_workers(
    pending: list[_Source],
    roots: list[Path],
    jobs: int | None,
    record: Any,
) -> None:
    from kllint import workers

    def start() -> Any:
        # In the worker: a deep (valid) expression needs a deep recursion; a
        # crash of the interpreter's stack is isolated here.
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
        # The analysis allocates millions of small containers (CST nodes, IR
        # trees, environments) and makes almost no cyclic garbage: the
        # collector's passes over the young objects cost ~15% of the run and
        # found ~16,000 objects over trl, verl and OpenRLHF. Reference
        # counting still frees everything else; the worker's memory is capped.
        gc.disable()
        from kllint.analysis.project import Project

        project = Project(roots)

        def analyse(index: int) -> _Outcome:
            outcome = _analyse(pending[index], project)
            for finding in outcome.findings:
                finding.site = None  # IR trees stay in the worker
            return outcome

        return analyse

    def failed(failure: workers.Failure) -> None:
        source = pending[failure.index]
        message = f"could not analyse: {failure.reason}"
        error = FileError(source.shown, 1, 1, message, code=COULD_NOT_ANALYSE)
        record(source, _Outcome([], error, cacheable=False))

    # Largest first: the longest analyses start early, the short ones fill in.
    sizes = [len(source.text) for source in pending]
    order = sorted(range(len(pending)), key=lambda i: -sizes[i])
    tasks = [workers.Task(i, i) for i in order]
    workers.run(
        tasks,
        worker_count(sum(sizes), jobs),
        start,
        lambda index, outcome: record(pending[index], outcome),
        failed,
    )


def _may_hold_kl(source: _Source) -> bool:
    roles = source.settings.roles
    return must_analyse(source.text, bool(roles.policy or roles.reference or roles.old))


def _analyse_here(source: _Source, project: Project) -> _Outcome:
    depth = _nesting(source.text)
    if depth > MAX_NESTING:
        message = f"could not analyse: brackets nested {depth} deep (more than {MAX_NESTING})"
        return _Outcome([], FileError(source.shown, 1, 1, message, code=COULD_NOT_ANALYSE))
    return _analyse(source, project)


def _analyse(source: _Source, project: Project) -> _Outcome:
    import libcst

    shown, text = source.shown, source.text
    project.begin_file()
    try:
        # Python's own parser warns about odd code (``1()``) on stderr; the
        # report is the only output.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            findings = check_source(text, shown, project, source.settings.roles)
    except libcst.ParserSyntaxError as err:
        # LibCST's verdict is the one that counts: it knows the syntax of
        # every Python version, where this Python's own parser may be older
        # than the code (a 3.12 f-string under 3.11).
        return _Outcome([], _syntax_error(shown, text, err))
    except MemoryError:
        raise  # a worker reports it and is replaced
    except (RecursionError, OverflowError) as err:
        # Valid code beyond what the analysis handles (a 10,000-term sum,
        # a literal over 1e308): this file is not analysed, the others are.
        if isinstance(err, RecursionError):
            message = "could not analyse: an expression is nested too deeply"
        else:
            message = f"could not analyse: a number too large ({err})"
        return _Outcome(
            [], FileError(shown, 1, 1, message, code=COULD_NOT_ANALYSE), cacheable=False
        )
    except Exception as err:
        # One file crashing the analysis must not hide the others' findings.
        error = FileError(shown, 1, 1, _internal_error_message(err), code=COULD_NOT_ANALYSE)
        return _Outcome([], error, internal=True, cacheable=False)
    return _Outcome(findings, dependencies=sorted(project.read_paths))


def _why_missing(path: Path) -> str:
    try:
        path.lstat()
    except OSError:
        return f"no such file or directory: {path}"
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == 40:  # ELOOP
            return f"symbolic link loop: {path}"
        return f"broken symbolic link: {path}"
    return f"cannot access: {path}"


def display_path(path: Path) -> str:
    """Relative to the working directory when under it, else as given.
    Control characters are escaped: a file name must not drive the terminal."""
    absolute, cwd = os.path.abspath(path), os.getcwd()
    if absolute == cwd:
        shown = "."
    elif absolute.startswith(cwd.rstrip(os.sep) + os.sep):
        shown = Path(absolute[len(cwd.rstrip(os.sep)) + 1 :]).as_posix()
    else:
        shown = path.as_posix()
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], shown)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _read(path: Path, settings: Settings, result: LintResult) -> _Source | None:
    """The decoded text of ``path``, or None with the reason in ``result.errors``."""
    shown = display_path(path)
    try:
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode):
            result.errors.append(FileError(shown, 1, 1, "cannot read file: not a regular file"))
            return None
        if status.st_size > MAX_FILE_BYTES:
            message = (
                f"could not analyse: file too large ({status.st_size / 2**20:.1f} MB; "
                f"the limit is {MAX_FILE_BYTES >> 20} MB)"
            )
            result.errors.append(FileError(shown, 1, 1, message, code=COULD_NOT_ANALYSE))
            return None
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        result.errors.append(FileError(shown, 1, 1, f"cannot read file: {err.strerror or err}"))
        return None
    source = _decoded(data, path, shown, settings, result)
    if source is not None:
        source.status = status
    return source


def _decoded(
    data: bytes, path: Path, shown: str, settings: Settings, result: LintResult
) -> _Source | None:
    try:
        text = _decode(data)
    except SyntaxError as err:  # an unknown or contradictory coding declaration
        result.errors.append(FileError(shown, err.lineno or 1, 1, f"SyntaxError: {err.msg}"))
        return None
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        encoding = (
            "UTF-8" if err.encoding.replace("-sig", "") in ("utf-8", "utf8") else err.encoding
        )
        message = f"UnicodeDecodeError: not valid {encoding} ({err.reason} at byte {err.start})"
        result.errors.append(FileError(shown, line, 1, message))
        return None
    notebook = None
    if is_notebook(path):
        try:
            notebook = Notebook.parse(text)
        except NotebookError as err:
            result.errors.append(FileError(shown, 1, 1, str(err)))
            return None
        text = notebook.code  # the code cells as one module; positions mapped back in _add
    # The roles configured for this file change what its analysis finds.
    content = content_hash(data)
    digest = f"{content}-{_roles_hash(settings)}"
    return _Source(path, shown, text, digest, settings, notebook, content=content)


def _decode(data: bytes) -> str:
    """As Python reads a source file: UTF-8 unless a BOM or a PEP 263
    ``# -*- coding: ... -*-`` line says otherwise."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as err:
        if "missing encoding declaration" not in str(err):
            raise
        encoding = "utf-8-sig"  # no declaration, and a first line that is not UTF-8
    return data.decode(encoding)


def _nesting(text: str) -> int:
    """The deepest bracket nesting, roughly (brackets in strings count too)."""
    brackets = re.sub(r"[^()\[\]{}]+", "", text)
    if len(brackets) < 2 * MAX_NESTING:
        return 0
    depth = deepest = 0
    for char in brackets:
        depth = depth + 1 if char in "([{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    return deepest


def _syntax_error(shown: str, source: str, err: libcst.ParserSyntaxError) -> FileError:
    # CPython's parser places the error better ("'(' was never closed" at the
    # bracket, where LibCST points at the end of the file).
    try:
        compile(source, shown, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as py_err:
        if py_err.lineno:
            return FileError(shown, py_err.lineno, py_err.offset or 1, f"SyntaxError: {py_err.msg}")
    except (ValueError, RecursionError, MemoryError):
        pass
    else:
        # Valid for this Python, rejected by LibCST: a limit of kllint's parser.
        message = re.sub(r"^(?:parser|tokenizer) error: (?:error at \d+:\d+: )?", "", err.message)
        return FileError(
            shown,
            err.raw_line,
            err.raw_column + 1,
            f"could not analyse: LibCST cannot parse this file ({message.splitlines()[0]})",
            code=COULD_NOT_ANALYSE,
        )
    message = re.sub(r"^(?:parser|tokenizer) error: (?:error at \d+:\d+: )?", "", err.message)
    return FileError(shown, err.raw_line, err.raw_column + 1, f"SyntaxError: {message}")


def _internal_error_message(err: Exception) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"internal error: {type(err).__name__}: {err}{where} (a bug in kllint; please report it)"
