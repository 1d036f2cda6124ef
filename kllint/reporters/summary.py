"""``--format summary``: Markdown for a CI job summary (GitHub's
``$GITHUB_STEP_SUMMARY``): the totals, findings per rule and per file, and
the first findings with links to their lines.

Links point at the commit being checked when GitHub's variables say which
(``GITHUB_SERVER_URL``, ``GITHUB_REPOSITORY``, ``GITHUB_SHA``); elsewhere
the paths are plain text."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping

from kllint.findings import FileError, LintResult
from kllint.reporters.common import entries, location, repo_relative, repo_root

# A summary is read, not processed: past this many, the annotations and the
# json/sarif output have the rest.
TOP = 20


def render(result: LintResult, environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    root = repo_root()
    files = result.files_checked
    lines = ["## kllint", ""]
    if not result.findings and not result.errors:
        lines.append(f"All checks passed! ({_plural(files, 'file')} checked)")
        return "\n".join(lines) + "\n"
    counts = []
    if result.findings:
        counts.append(_plural(len(result.findings), "finding"))
    if result.errors:
        counts.append(f"{_plural(len(result.errors), 'file')} that could not be checked")
    lines += [f"**{' and '.join(counts)}** in {_plural(files, 'checked file')}.", ""]

    if result.findings:
        by_rule = Counter((f.code, f.name) for f in result.findings)
        lines += ["| rule | name | findings |", "|---|---|---:|"]
        lines += [
            f"| {code} | `{name}` | {n} |"
            for (code, name), n in sorted(by_rule.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        lines.append("")
        by_file = Counter(repo_relative(f.path, root) for f in result.findings)
        lines += ["| file | findings |", "|---|---:|"]
        lines += [
            f"| {_link(path, None, environ, path)} | {n} |"
            for path, n in sorted(by_file.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        lines.append("")

    shown = entries(result)[:TOP]
    lines.append(
        f"### {'First ' + str(TOP) if len(shown) < len(entries(result)) else 'All'} findings"
    )
    lines.append("")
    for e in shown:
        path = repo_relative(e.path, root)
        target = _link(path, e.line if e.cell is None else None, environ, location(e))
        if isinstance(e, FileError):
            lines.append(f"- {target} **{e.code}** {_escape(e.message)}")
        else:
            lines.append(f"- {target} **{e.code}** `{e.name}` {_escape(e.message)}")
    return "\n".join(lines) + "\n"


def _link(path: str, line: int | None, environ: Mapping[str, str], text: str) -> str:
    server, repository, sha = (
        environ.get("GITHUB_SERVER_URL"),
        environ.get("GITHUB_REPOSITORY"),
        environ.get("GITHUB_SHA"),
    )
    if not (server and repository and sha):
        return f"`{text}`"
    anchor = f"#L{line}" if line is not None else ""
    return f"[`{text}`]({server}/{repository}/blob/{sha}/{path}{anchor})"


def _escape(text: str) -> str:
    # A message is one line; keep it from opening Markdown or HTML constructs.
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
