"""Jupyter notebooks: their code cells as one Python module, and back.

A notebook is linted as the concatenation of its code cells, in order, the
way the kernel runs them top to bottom: a helper defined in cell 2 is known
in cell 5. IPython syntax is not Python, so a line magic or shell escape
(``%time``, ``!pip install``, ``files = !ls``, ``obj?``) becomes ``pass`` at
its indentation (a block keeps a body) and a cell magic (``%%bash``) blanks
its whole cell; lines keep their numbers either way.

Positions found in that module are mapped back to ``(cell, line)``: cells
are numbered from 1 in file order, markdown cells included, which is what a
reader counts in Jupyter or VS Code; lines count from the cell's first line.

``replace_cell_source`` is the writer: it changes one cell's source and
leaves outputs, metadata, key order and indentation as they were.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from kllint.findings import FileError, Finding

SUFFIX = ".ipynb"

# `%magic`, `!shell`, `files = !ls`, `x = %time f()`, `obj?`, `??obj`
_IPYTHON_LINE = re.compile(
    r"^(?P<indent>[ \t]*)(?:[%!?]|[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*[%!]|[\w.]+\?{1,2}\s*$)"
)

_Located = TypeVar("_Located", Finding, FileError)


class NotebookError(ValueError):
    """Not a notebook kllint can read (not JSON, or no ``cells`` list)."""


def is_notebook(path: str | Path) -> bool:
    return str(path).endswith(SUFFIX)


def cell_key(path: str, cell: int) -> str:
    """Where a cell's source is kept in ``LintResult.sources`` (for snippets)."""
    return f"{path}#cell {cell}"


@dataclass(frozen=True)
class Notebook:
    cells: tuple[dict[str, Any], ...]
    # The code cells as one module, IPython lines replaced.
    code: str
    # For each code cell in ``code``: its first line there (1-based) and its number.
    starts: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, text: str) -> Notebook:
        document = _load(text)
        cells = tuple(document["cells"])
        if not _is_python(document):
            return cls(cells, "", ())
        parts: list[str] = []
        starts: list[tuple[int, int]] = []
        line = 1
        for number, cell in enumerate(cells, start=1):
            if cell.get("cell_type") != "code":
                continue
            lines = python_lines(cell_source(cell))
            if not lines:
                continue
            starts.append((line, number))
            parts.extend(lines)
            line += len(lines)
        return cls(cells, "".join(parts), tuple(starts))

    def cell_code(self, number: int) -> str:
        """The source of cell ``number`` as the user wrote it, magics included."""
        return cell_source(self.cells[number - 1])

    def locate(self, line: int) -> tuple[int, int]:
        """``(cell, line in cell)`` for a line of ``code``."""
        index = bisect.bisect_right([start for start, _ in self.starts], line) - 1
        if index < 0:  # before any cell: only an empty notebook has no starts
            return (self.starts[0][1] if self.starts else 1, line)
        start, number = self.starts[index]
        return (number, line - start + 1)

    def relocate(self, item: _Located) -> _Located:
        """A finding or file error at a line of ``code``, placed in its cell."""
        cell, line = self.locate(item.line)
        if isinstance(item, FileError):
            return replace(item, cell=cell, line=line)
        end_cell, end_line = self.locate(item.end_line)
        end_column = item.end_column
        if end_cell != cell:  # a span cannot leave its cell; clip it at the cell's end
            end_line = len(self.cell_code(cell).splitlines()) or 1
            end_column = len(self.cell_code(cell).splitlines()[-1]) + 1 if end_line > 0 else 1
        return replace(item, cell=cell, line=line, end_line=end_line, end_column=end_column)


def python_lines(source: str) -> list[str]:
    """The lines of one cell as Python, each ending in a newline; IPython
    lines become ``pass`` (or nothing, for a cell magic) so numbers hold."""
    lines = source.splitlines()
    if not lines:
        return []
    if lines[0].lstrip().startswith("%%"):
        return ["\n"] * len(lines)
    out = []
    for text in lines:
        match = _IPYTHON_LINE.match(text)
        out.append(f"{match.group('indent')}pass\n" if match and text.strip() else f"{text}\n")
    return out


def cell_source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def replace_cell_source(text: str, number: int, source: str) -> str:
    """The notebook ``text`` with cell ``number``'s source replaced and
    everything else (outputs, execution counts, metadata, key order, the
    file's indentation and final newline) kept. Raises ``NotebookError``."""
    document = _load(text)
    cells = document["cells"]
    if not 1 <= number <= len(cells):
        raise NotebookError(f"no cell {number} (the notebook has {len(cells)})")
    cell = cells[number - 1]
    # nbformat stores a list of lines; keep whichever form the file uses.
    cell["source"] = (
        source.splitlines(keepends=True) if isinstance(cell.get("source"), list) else source
    )
    indent = _indent_of(text)
    dumped = json.dumps(document, indent=indent, ensure_ascii=False)
    return dumped + "\n" if text.endswith("\n") else dumped


def file_line(text: str, cell: int, line: int) -> int | None:
    """The line of the ``.ipynb`` file that holds line ``line`` of cell
    ``cell``, for tools that place marks on the file's own lines (GitHub
    annotations, SARIF). Jupyter writes a source as a list, one line of the
    cell per line of the file after ``"source": [``; ``None`` when the file
    is laid out otherwise (a source written as one string, a minified file)."""
    try:
        cells = _load(text)["cells"]
    except NotebookError:
        return None
    # Keys of every cell, in order; a quote inside a source is escaped, so it cannot match.
    keys = [m.start() for m in re.finditer(r'^\s*"source": \[$', text, re.MULTILINE)]
    if len(keys) != len(cells) or not 1 <= cell <= len(cells):
        return None
    source = cells[cell - 1].get("source")
    if not isinstance(source, list) or not 1 <= line <= len(source):
        return None
    return text.count("\n", 0, keys[cell - 1]) + 1 + line


def _load(text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise NotebookError(
            f"not a notebook: invalid JSON ({err.msg} at line {err.lineno})"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
        raise NotebookError("not a notebook: no list of cells")
    return document


def _is_python(document: dict[str, Any]) -> bool:
    metadata = document.get("metadata") or {}
    language = (metadata.get("language_info") or {}).get("name") or (
        metadata.get("kernelspec") or {}
    ).get("language")
    return language in (None, "python")


def _indent_of(text: str) -> int | None:
    lines = text.splitlines()
    if len(lines) < 2:
        return None  # one line: written compactly
    second = lines[1]
    return len(second) - len(second.lstrip(" ")) or None
