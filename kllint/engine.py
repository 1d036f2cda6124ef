"""One lint run: find the files, check each, keep what the settings allow."""

from __future__ import annotations

import ast
import os
import re
import traceback
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import libcst

from kllint.analysis.project import Project
from kllint.config import Settings
from kllint.discovery import discover
from kllint.driver import check_source
from kllint.findings import FileError, Finding, LintResult
from kllint.notebook import Notebook, NotebookError, cell_key, is_notebook
from kllint.suppression import (
    is_suppressed,
    might_suppress,
    parse_comments,
    stale_suppressions,
    suppression_table,
)


class MissingPathError(Exception):
    """A path named on the command line does not exist."""


# Below this many files a worker pool costs more (process start, a second
# project index) than it saves.
PARALLEL_MIN_FILES = 24


def lint_paths(
    paths: Sequence[str | Path], settings: Settings | None = None, *, jobs: int | None = None
) -> LintResult:
    """Lint files and directories. Raises ``MissingPathError`` before linting
    anything when a path does not exist.

    ``jobs``: worker processes (default: one per CPU). Findings from workers
    carry no KL site (IR trees do not cross processes), so callers that need
    sites (``--confirm``) pass ``jobs=1``."""
    settings = settings or Settings()
    targets = [Path(p) for p in paths] or [Path(".")]
    missing = [str(p) for p in targets if not p.exists()]
    if missing:
        raise MissingPathError(f"no such file or directory: {', '.join(missing)}")

    roots = dict.fromkeys([settings.root, *(p if p.is_dir() else p.parent for p in targets)])
    project = Project(list(roots))
    result = LintResult(findings=[], errors=[], files_checked=0)
    files: dict[str, Path] = {}
    for path in discover(targets, settings):
        files.setdefault(os.path.abspath(path), path)  # `kllint . a.py` lints a.py once
    workers = min(jobs or os.cpu_count() or 1, len(files) // (PARALLEL_MIN_FILES // 2) or 1)
    if workers > 1 and len(files) >= PARALLEL_MIN_FILES:
        _lint_in_parallel(list(files.values()), settings, list(roots), workers, result)
    else:
        for path in files.values():
            _lint_file(path, settings, project, result)
    result.findings.sort(key=Finding.sort_key)
    result.errors.sort(key=lambda e: (e.path, e.cell or 0, e.line, e.column))
    result.warnings.sort(key=lambda e: (e.path, e.cell or 0, e.line, e.column))
    return result


def lint_source(data: bytes, filename: str, settings: Settings | None = None) -> LintResult:
    """Lint text that has no file (``kllint -``): ``filename`` places it for
    the config file, ``per-file-ignores`` and reports, and whether it is a
    notebook. Helpers it imports are still read from disk around it."""
    path = Path(filename)
    settings = settings or Settings()
    project = Project(list(dict.fromkeys([settings.root, Path(os.path.abspath(path)).parent])))
    result = LintResult(findings=[], errors=[], files_checked=0)
    _lint_data(data, path, settings, project, result)
    result.findings.sort(key=Finding.sort_key)
    return result


def _lint_in_parallel(
    files: list[Path], settings: Settings, roots: list[Path], workers: int, result: LintResult
) -> None:
    # Contiguous chunks keep a package's files (and the helpers they share,
    # parsed once per worker) together.
    size = -(-len(files) // workers)
    chunks = [files[i : i + size] for i in range(0, len(files), size)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for part in pool.map(_lint_chunk, chunks, [settings] * len(chunks), [roots] * len(chunks)):
            result.findings.extend(part.findings)
            result.errors.extend(part.errors)
            result.files_checked += part.files_checked
            result.internal_errors += part.internal_errors
            result.sources.update(part.sources)
            result.warnings.extend(part.warnings)


def _lint_chunk(files: list[Path], settings: Settings, roots: list[Path]) -> LintResult:
    project = Project(roots)
    part = LintResult(findings=[], errors=[], files_checked=0)
    for path in files:
        _lint_file(path, settings, project, part)
    for finding in part.findings:
        finding.site = None
    return part


def display_path(path: Path) -> str:
    """Relative to the working directory when under it, else as given."""
    try:
        return Path(os.path.abspath(path)).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


def _lint_file(path: Path, settings: Settings, project: Project, result: LintResult) -> None:
    try:
        data = path.read_bytes()
    except OSError as err:
        message = f"cannot read file: {err.strerror or err}"
        result.errors.append(FileError(display_path(path), 1, 1, message))
        return
    _lint_data(data, path, settings, project, result)


def _lint_data(
    data: bytes, path: Path, settings: Settings, project: Project, result: LintResult
) -> None:
    shown = display_path(path)
    settings = settings.for_path(path)  # the file's nearest config file
    try:
        source = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        message = f"UnicodeDecodeError: not valid UTF-8 ({err.reason} at byte {err.start})"
        result.errors.append(FileError(shown, line, 1, message))
        return
    notebook = None
    if is_notebook(path):
        try:
            notebook = Notebook.parse(source)
        except NotebookError as err:
            result.errors.append(FileError(shown, 1, 1, str(err)))
            return
        source = notebook.code  # the code cells as one module; positions mapped back below
    result.files_checked += 1

    try:
        findings = check_source(source, shown, project, settings.roles)
    except libcst.ParserSyntaxError as err:
        error = _syntax_error(shown, source, err)
        result.errors.append(notebook.relocate(error) if notebook else error)
        return
    except Exception as err:
        # One file crashing the analysis must not hide the others' findings.
        result.errors.append(FileError(shown, 1, 1, _internal_error_message(err)))
        result.internal_errors += 1
        return

    enabled = settings.select - settings.ignored_codes(path)
    findings = [f for f in findings if f.code in enabled]
    warnings: list[FileError] = []
    if might_suppress(source):
        comments = parse_comments(source)
        suppressions = suppression_table(comments)
        warnings = stale_suppressions(comments, findings, enabled, shown)
        findings = [f for f in findings if not is_suppressed(f, suppressions)]
    if notebook is not None:
        findings = [notebook.relocate(f) for f in findings]
        warnings = [notebook.relocate(w) for w in warnings]
        for cell in {f.cell for f in findings if f.cell is not None}:
            result.sources[cell_key(shown, cell)] = notebook.cell_code(cell)
    elif findings:
        result.sources[shown] = source
    result.findings.extend(findings)
    result.warnings.extend(warnings)


def _syntax_error(shown: str, source: str, err: libcst.ParserSyntaxError) -> FileError:
    # CPython's parser places the error better ("'(' was never closed" at the
    # bracket, where LibCST points at the end of the file). LibCST's own error
    # is the fallback, for syntax this Python accepts and LibCST does not.
    try:
        compile(source, shown, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as py_err:
        if py_err.lineno:
            return FileError(shown, py_err.lineno, py_err.offset or 1, f"SyntaxError: {py_err.msg}")
    except (ValueError, RecursionError, MemoryError):
        pass
    message = re.sub(r"^(?:parser|tokenizer) error: (?:error at \d+:\d+: )?", "", err.message)
    return FileError(shown, err.raw_line, err.raw_column + 1, f"SyntaxError: {message}")


def _internal_error_message(err: Exception) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"internal error: {type(err).__name__}: {err}{where} (a bug in kllint; please report it)"
