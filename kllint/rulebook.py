"""The rule book: one Markdown page per rule, ``rules/KL002.md`` in the source
tree and ``kllint/rulebook/KL002.md`` in a wheel (pyproject force-includes it).

A page has Ruff's fixed sections as ``## `` headings: What it does, Why is
this bad?, Example, Use instead, Fix safety, References."""

from __future__ import annotations

from pathlib import Path

from kllint.rules import RULES

_PACKAGE = Path(__file__).resolve().parent


def page_dirs() -> list[Path]:
    """Where pages are looked for: the installed copy, then a source checkout's."""
    return [_PACKAGE / "rulebook", _PACKAGE.parent / "rules"]


def find_rule_page(code: str) -> str | None:
    for directory in page_dirs():
        page = directory / f"{code}.md"
        if page.is_file():
            return page.read_text(encoding="utf-8")
    return None


def rule_page(code: str) -> str:
    """The page of ``code``, or a stand-in built from its summary that says the page is missing."""
    page = find_rule_page(code)
    if page is not None:
        return page
    rule = RULES[code]
    return (
        f"# {rule.code}: {rule.name}\n\n{rule.summary}\n\n"
        f"The full page for {rule.code} is missing from this installation "
        f"(looked for {code}.md in: {', '.join(str(d) for d in page_dirs())}).\n"
    )


def parse_sections(page: str) -> dict[str, str]:
    """The page split at its ``## `` headings: heading -> body (stripped). The
    text before the first heading (title and summary) is under ``""``.
    Headings inside fenced code blocks (a ``## `` comment in an example) are
    not headings."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    fenced = False
    for line in page.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        else:
            sections[current].append(line)
    return {heading: "\n".join(lines).strip() for heading, lines in sections.items()}
