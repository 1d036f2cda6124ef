"""Output formats. Text formats end with a summary line; machine formats
(json, github, sarif) print nothing but the report; ``summary`` is Markdown
for a CI job summary."""

from __future__ import annotations

from kllint.findings import LintResult
from kllint.reporters import github, json_output, sarif, summary, text

FORMATS = ("full", "concise", "json", "github", "sarif", "summary")


def render(result: LintResult, format: str = "full", *, color: bool = False) -> str:
    if format == "full":
        return text.render_full(result, color=color)
    if format == "concise":
        return text.render_concise(result, color=color)
    if format == "json":
        return json_output.render(result)
    if format == "github":
        return github.render(result)
    if format == "sarif":
        return sarif.render(result)
    if format == "summary":
        return summary.render(result)
    raise ValueError(f"unknown output format {format!r} (known: {', '.join(FORMATS)})")
