"""Suppression comments.

``# noqa`` and ``# kllint: ignore`` silence every rule on their line;
``# noqa: KL002,KL003``, ``# noqa: differentiated-k3-estimate`` and
``# kllint: ignore[KL002]`` only the rules they name (a code or a name,
not a prefix, as in Ruff). A finding that spans lines is silenced by a
comment on its first or its last line, where a formatter leaves it.

Comments are found with ``tokenize``, so ``"# noqa"`` inside a string
silences nothing.

A comment naming a kllint rule that silences nothing on its line, or a
``KL`` code that is no rule, is reported by ``stale_suppressions`` as a
warning (on stderr, not a finding): a stale comment is not a gradient bug,
so it must not fail CI, but it would hide the next real one on that line.
Codes of other tools (``# noqa: E501``) and a bare ``# noqa`` are left alone.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kllint.findings import FileError, Finding
from kllint.rules import RULES

_NOQA = re.compile(r"#\s*noqa(?![\w-])(?::\s*(?P<codes>[\w-]+(?:[\s,]+[\w-]+)*))?", re.IGNORECASE)
_KLLINT_IGNORE = re.compile(
    r"#\s*kllint:\s*ignore(?![\w-])(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE
)

# line -> the upper-cased codes and names silenced there; ``None``: everything.
Suppressions = Mapping[int, "frozenset[str] | None"]


@dataclass(frozen=True)
class SuppressionComment:
    line: int
    column: int  # 1-based, of the ``#``
    kind: str  # "noqa" | "kllint"
    names: frozenset[str] | None  # upper-cased codes and names; ``None``: every rule


def parse_comments(source: str) -> list[SuppressionComment]:
    comments = []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    try:
        for token in tokens:
            if token.type != tokenize.COMMENT:
                continue
            line, column = token.start
            for kind, pattern in (("noqa", _NOQA), ("kllint", _KLLINT_IGNORE)):
                for match in pattern.finditer(token.string):
                    codes = match.group("codes")
                    if codes is None and token.string[match.end() :].startswith("["):
                        continue  # ``# kllint: ignore[KL002`` unterminated: silences nothing
                    names = _named(codes) if codes else None
                    comments.append(
                        SuppressionComment(line, column + match.start() + 1, kind, names)
                    )
    except (tokenize.TokenError, SyntaxError):
        pass  # keep the comments before the bad token; the parser reports the error
    return comments


def might_suppress(source: str, findings: bool = True) -> bool:
    """A cheap test before tokenizing: most files have no suppression comment.
    ``findings``: whether the file has any. Without findings a comment
    matters only if it can be stale: a ``kllint:`` comment, or a ``noqa``
    naming a ``KL`` code or a rule (large model code has thousands of
    ``# noqa: E501``, and tokenizing it was a second of a run)."""
    lowered = source.lower()
    if "kllint:" in lowered:
        return True
    if "noqa" not in lowered:
        return False
    if findings:
        return True
    return any(
        _names_a_rule(match.group("codes"))
        for match in _NOQA.finditer(source)
        if match.group("codes")
    )


def _names_a_rule(codes: str) -> bool:
    return any(_KL_CODE.fullmatch(n) or n in _CODE_OF_NAME for n in _named(codes))


def _named(codes: str) -> frozenset[str]:
    """The upper-cased codes and names a comment lists (``KL002, differentiated-k3-estimate``)."""
    return frozenset(re.findall(r"[\w-]+", codes.upper()))


_KL_CODE = re.compile(r"KL\d+")
_CODE_OF_NAME = {r.name.upper(): r.code for r in RULES.values()}


def parse_suppressions(source: str) -> dict[int, frozenset[str] | None]:
    return suppression_table(parse_comments(source))


def suppression_table(comments: Iterable[SuppressionComment]) -> dict[int, frozenset[str] | None]:
    """Line -> the codes and names silenced there (``None``: every rule)."""
    table: dict[int, frozenset[str] | None] = {}
    for comment in comments:
        previous = table.get(comment.line, frozenset())
        if comment.names is None or previous is None:
            table[comment.line] = None
        else:
            table[comment.line] = previous | comment.names
    return table


def is_suppressed(finding: Finding, suppressions: Suppressions) -> bool:
    for line in {finding.line, finding.end_line}:
        if line not in suppressions:
            continue
        names = suppressions[line]
        if names is None or finding.code.upper() in names or finding.name.upper() in names:
            return True
    return False


def stale_suppressions(
    comments: Iterable[SuppressionComment],
    findings: Iterable[Finding],
    enabled: Iterable[str],
    path: str,
) -> list[FileError]:
    """Warnings for suppression comments that name an unknown ``KL`` rule, or
    a rule enabled for this file that reports nothing on the comment's line.
    ``findings``: the file's findings of enabled rules, before suppression."""
    enabled = frozenset(enabled)
    reported: dict[int, set[str]] = {}
    for f in findings:
        for line in {f.line, f.end_line}:
            reported.setdefault(line, set()).add(f.code)
    warnings = []
    for comment in comments:
        here = reported.get(comment.line, set())
        if comment.names is None:
            # A blanket noqa may be another tool's; a blanket kllint-ignore is ours.
            if comment.kind == "kllint" and not here:
                warnings.append(
                    FileError(path, comment.line, comment.column, _unused("kllint: ignore"))
                )
            continue
        for name in sorted(comment.names):
            code = name if name in RULES else _CODE_OF_NAME.get(name)
            if code is None:
                if comment.kind == "kllint" or _KL_CODE.fullmatch(name):
                    warnings.append(
                        FileError(
                            path,
                            comment.line,
                            comment.column,
                            f"unknown rule {name!r} in a suppression comment (see `kllint rules`)",
                        )
                    )
            elif code in enabled and code not in here:
                warnings.append(FileError(path, comment.line, comment.column, _unused(name)))
    return warnings


def _unused(what: str) -> str:
    return f"unused suppression: {what} silences nothing on this line"


def with_noqa(
    source: str, codes_by_line: Mapping[int, Iterable[str]], tokens_of: str | None = None
) -> tuple[str, list[int]]:
    """``source`` with ``# noqa: CODES`` at the end of each given line (merged
    into a ``# noqa:`` already there), and the lines that could not take a
    comment: inside a string that spans lines, or continued with a backslash.
    ``tokens_of``: the same lines as Python, when ``source`` is not (a
    notebook cell with magics)."""
    lines = source.splitlines(keepends=True)
    in_string = _lines_inside_strings(tokens_of if tokens_of is not None else source)
    existing = {c.line: c for c in parse_comments(tokens_of if tokens_of is not None else source)}
    refused = []
    for number, codes in sorted(codes_by_line.items()):
        if not 0 < number <= len(lines):
            refused.append(number)
            continue
        text = lines[number - 1]
        body = text.rstrip("\r\n")
        ending = text[len(body) :]
        if number in in_string or body.rstrip().endswith("\\"):
            refused.append(number)
            continue
        comment = existing.get(number)
        if comment is not None and comment.kind == "noqa" and comment.names is None:
            continue  # a bare noqa already silences everything
        if comment is not None and comment.kind == "noqa":
            match = _NOQA.search(body, comment.column - 1)
            assert match is not None and match.group("codes")
            merged = ", ".join(
                [match.group("codes"), *sorted(set(codes) - set(comment.names or ()))]
            )
            body = body[: match.start("codes")] + merged + body[match.end("codes") :]
        else:
            body = f"{body.rstrip()}  # noqa: {', '.join(sorted(set(codes)))}"
        lines[number - 1] = body + (ending or "\n")
    return "".join(lines), refused


def _lines_inside_strings(source: str) -> set[int]:
    """Lines a comment cannot end: all but the last of a string spanning lines."""
    inside: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING or token.type == getattr(
                tokenize, "FSTRING_MIDDLE", -1
            ):
                inside.update(range(token.start[0], token.end[0]))
    except (tokenize.TokenError, SyntaxError):
        pass
    return inside


def add_noqa_comments(findings: Iterable[Finding]) -> tuple[int, list[tuple[str, str]]]:
    """``--add-noqa``: silence each finding where it is reported, in its file
    (a notebook's cell is rewritten, its outputs kept). Returns how many
    comments were added and ``(path, reason)`` for what was left alone. A file
    is written only if it still parses afterwards."""
    from kllint.notebook import Notebook, is_notebook, python_lines, replace_cell_source

    by_file: dict[tuple[str, int | None], dict[int, set[str]]] = {}
    for f in findings:
        by_file.setdefault((f.path, f.cell), {}).setdefault(f.line, set()).add(f.code)
    added = 0
    skipped: list[tuple[str, str]] = []
    for path in dict.fromkeys(path for path, _ in by_file):
        try:
            original = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            skipped.append((path, f"cannot read it: {err}"))
            continue
        text = original
        file_added = 0
        refused: list[str] = []
        for (file, cell), codes_by_line in by_file.items():
            if file != path:
                continue
            if cell is None:
                text, lines = with_noqa(text, codes_by_line)
            else:
                code = Notebook.parse(text).cell_code(cell)
                new_code, lines = with_noqa(code, codes_by_line, "".join(python_lines(code)))
                text = replace_cell_source(text, cell, new_code)
            refused += [f"{'cell ' + str(cell) + ':' if cell else ''}{n}" for n in lines]
            file_added += sum(1 for n in codes_by_line if n not in lines)
        if refused:
            skipped.append((path, f"line {', '.join(refused)} cannot end with a comment"))
        if text != original:
            check = Notebook.parse(text).code if is_notebook(path) else text
            try:
                compile(check, path, "exec", ast.PyCF_ONLY_AST)
            except SyntaxError:
                skipped.append((path, "it would no longer parse"))
                continue
            Path(path).write_text(text, encoding="utf-8")
            added += file_added
    return added, skipped
