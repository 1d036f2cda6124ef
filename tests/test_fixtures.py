"""The fixture corpus: code annotated with what kllint must and must not say.

Conventions (Semgrep style), on the line *above* the line they describe:

    # error: KL002        this line must be reported with KL002
    # ok: KL002           this line must not be reported with KL002
    # todo-error: KL003   a known false negative, kept visible

Every finding must be expected by an ``error`` annotation: an unannotated
finding fails the test, so the corpus measures precision as well as recall.
A token-level k3 loss may also carry KL003 where KL002 is expected.
Each finding reads as one short headline with its reasoning in notes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from corpus import findings_of

FIXTURES = Path(__file__).parent / "fixtures"
FILES = sorted(p for p in FIXTURES.rglob("*.py"))
ANNOTATION = re.compile(r"#\s*(error|ok|todo-error):\s*([A-Z0-9, ]+)")


def expectations(source: str) -> dict[str, dict[int, set[str]]]:
    table: dict[str, dict[int, set[str]]] = {"error": {}, "ok": {}, "todo-error": {}}
    lines = source.splitlines()
    for number, line in enumerate(lines, 1):
        match = ANNOTATION.search(line)
        if match is None or not line.lstrip().startswith("#"):
            continue
        target = number + 1
        # The annotation applies to the next line that is code (not another annotation).
        while target <= len(lines) and lines[target - 1].lstrip().startswith("#"):
            target += 1
        codes = {c.strip() for c in match.group(2).split(",") if c.strip()}
        table[match.group(1)].setdefault(target, set()).update(codes)
    return table


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(FIXTURES)) for p in FILES])
def test_fixture(path: Path) -> None:
    source = path.read_text()
    expected = expectations(source)
    findings = findings_of(path)
    reported: dict[int, set[str]] = {}
    for finding in findings:
        reported.setdefault(finding.line, set()).add(finding.code)
        # Every headline is one short line; the reasoning is in the notes.
        assert "\n" not in finding.message and ";" not in finding.message, finding.message
        assert len(finding.message) <= 120, finding.message
        assert finding.notes, finding.code

    problems = []
    for line, codes in expected["error"].items():
        missing = codes - reported.get(line, set())
        if missing:
            problems.append(
                f"line {line}: expected {sorted(missing)}, got {sorted(reported.get(line, set()))}"
            )
    for line, codes in expected["ok"].items():
        wrong = codes & reported.get(line, set())
        if wrong:
            problems.append(f"line {line}: must not report {sorted(wrong)}")
    for line, codes in reported.items():
        allowed = expected["error"].get(line, set()) | expected["todo-error"].get(line, set())
        if "KL002" in allowed:
            allowed = allowed | {"KL003"}
        unexpected = codes - allowed
        if unexpected:
            messages = [f.message for f in findings if f.line == line and f.code in unexpected]
            problems.append(f"line {line}: unexpected {sorted(unexpected)}: {messages[0][:200]}")
    assert not problems, "\n".join(problems)
