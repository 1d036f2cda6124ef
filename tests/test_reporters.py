"""What each output format prints for the same lint result."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

import pytest
from fake_analysis import finding

from kllint.findings import FileError, LintResult
from kllint.reporters import render
from kllint.reporters.github import escape_data, escape_property
from kllint.rulebook import parse_sections
from kllint.rules import RULES

TRAIN = (
    "import torch\n"
    "\n"
    "def loss_fn(logp, ref_logp, beta):\n"
    "    kl = low_var_kl(logp, ref_logp)\n"
    "    return beta * kl.mean()\n"
)


class Level(enum.Enum):
    TOKEN = "token"


def result() -> LintResult:
    """Two findings in train.py, given out of order, and a file that does not parse."""
    k5 = finding(
        "KL005",
        "train.py",
        5,
        12,
        span=13,
        message="The KL term has no gradient",
        severity="warning",
    )
    k2 = finding(
        "KL002",
        "train.py",
        4,
        10,
        span=26,
        message="k3 is differentiated: its gradient is that of KL(ref||pi), 100% reversed",
        fix_title="Use the k2 estimate 0.5 * log_ratio**2",
        facts={"estimator": "k3", "levels": {Level.TOKEN}},
    )
    return LintResult(
        findings=[k5, k2],
        errors=[FileError("broken.py", 3, 5, "SyntaxError: '(' was never closed")],
        files_checked=2,
        sources={"train.py": TRAIN},
    )


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_full_shows_the_line_the_carets_and_the_fix() -> None:
    assert render(result(), "full") == (
        "broken.py:3:5: E999 SyntaxError: '(' was never closed\n"
        "\n"
        "train.py:4:10: KL002 [differentiated-k3-estimate] k3 is differentiated: "
        "its gradient is that of KL(ref||pi), 100% reversed\n"
        "  |\n"
        "4 |     kl = low_var_kl(logp, ref_logp)\n"
        "  |          ^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "  |\n"
        "  = help: Use the k2 estimate 0.5 * log_ratio**2\n"
        "\n"
        "train.py:5:12: KL005 [kl-loss-without-gradient] The KL term has no gradient\n"
        "  |\n"
        "5 |     return beta * kl.mean()\n"
        "  |            ^^^^^^^^^^^^^\n"
        "  |\n"
        "\n"
        "Found 2 findings (KL002: 1, KL005: 1). 1 file could not be checked.\n"
    )


def test_concise_is_one_line_each() -> None:
    assert render(result(), "concise").splitlines() == [
        "broken.py:3:5: E999 SyntaxError: '(' was never closed",
        "train.py:4:10: KL002 [differentiated-k3-estimate] k3 is differentiated: "
        "its gradient is that of KL(ref||pi), 100% reversed",
        "train.py:5:12: KL005 [kl-loss-without-gradient] The KL term has no gradient",
        "Found 2 findings (KL002: 1, KL005: 1). 1 file could not be checked.",
    ]


def test_text_summary_when_clean() -> None:
    clean = LintResult(findings=[], errors=[], files_checked=3)
    assert render(clean, "full") == "All checks passed!\n"
    assert render(clean, "concise") == "All checks passed!\n"


def test_full_underlines_to_the_end_of_the_line_for_a_multiline_finding() -> None:
    multiline = finding("KL002", "train.py", 4, 10, end_line=5, end_column=5)
    out = render(LintResult([multiline], [], 1, sources={"train.py": TRAIN}), "full")
    assert "  |          " + "^" * 26 + "\n" in out


def test_json_objects_sorted_by_path_line_column() -> None:
    entries = json.loads(render(result(), "json"))
    assert [(e["path"], e["line"], e["code"]) for e in entries] == [
        ("broken.py", 3, "E999"),
        ("train.py", 4, "KL002"),
        ("train.py", 5, "KL005"),
    ]
    keys = {"code", "name", "path", "line", "column", "end_line", "end_column"}
    keys |= {"severity", "message", "notes", "fix_title", "facts", "cell", "fix"}
    assert all(set(e) == keys for e in entries)
    k2 = entries[1]
    assert k2["name"] == "differentiated-k3-estimate"
    assert (k2["column"], k2["end_line"], k2["end_column"]) == (10, 4, 36)
    assert k2["facts"] == {"estimator": "k3", "levels": ["token"]}
    assert entries[2]["severity"] == "warning"


def test_json_has_the_confirmation_after_confirm() -> None:
    confirmed = result()
    confirmed.findings[0].confirmation = {"verdict": "confirmed", "cosine": -0.98}
    entries = json.loads(render(confirmed, "json"))
    assert entries[2]["confirmation"] == {"verdict": "confirmed", "cosine": -0.98}
    assert "confirmation" not in entries[1]


def test_github_escapes_data_and_properties() -> None:
    assert escape_data("100% wrong\r\nnext: a,b") == "100%25 wrong%0D%0Anext: a,b"
    assert escape_property("dir,1/a:b.py") == "dir%2C1/a%3Ab.py"


def test_github_annotations() -> None:
    assert render(result(), "github").splitlines() == [
        "::error file=broken.py,line=3,col=5,endLine=3,endColumn=5,title=kllint (E999)"
        "::SyntaxError: '(' was never closed",
        "::error file=train.py,line=4,col=10,endLine=4,endColumn=36,title=kllint (KL002)"
        "::k3 is differentiated: its gradient is that of KL(ref||pi), 100%25 reversed"
        "%0Ahelp: Use the k2 estimate 0.5 * log_ratio**2",
        "::warning file=train.py,line=5,col=12,endLine=5,endColumn=25,title=kllint (KL005)"
        "::The KL term has no gradient",
    ]


def test_github_paths_are_relative_to_the_repository_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "rl").mkdir()
    monkeypatch.chdir(tmp_path / "rl")
    out = render(LintResult([finding("KL002", "ppo.py", 7, 3)], [], 1), "github")
    assert out.startswith("::error file=rl/ppo.py,line=7,col=3,")


def sarif(lint: LintResult) -> dict[str, Any]:
    log: dict[str, Any] = json.loads(render(lint, "sarif"))
    return log


def test_sarif_log_structure() -> None:
    log = sarif(result())
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "kllint"
    assert {"version", "informationUri"} <= set(driver)
    assert [r["id"] for r in driver["rules"]] == list(RULES)
    for rule in driver["rules"]:
        assert {"name", "shortDescription", "fullDescription", "help"} <= set(rule)
        assert {"text", "markdown"} <= set(rule["help"])
        assert rule["defaultConfiguration"]["level"] in {"error", "warning", "note"}

    first, second = run["results"]
    assert first["ruleId"] == "KL002"
    assert driver["rules"][first["ruleIndex"]]["id"] == "KL002"
    assert second["level"] == "warning"
    assert first["message"]["text"].startswith("k3 is differentiated")
    (location,) = first["locations"]
    physical = location["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
    assert physical["region"] == {"startLine": 4, "startColumn": 10, "endLine": 4, "endColumn": 36}
    assert first["partialFingerprints"]["primaryLocationLineHash"]
    assert first["properties"]["facts"] == {"estimator": "k3", "levels": ["token"]}

    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is True
    (notification,) = invocation["toolExecutionNotifications"]
    assert notification["descriptor"]["id"] == "E999"
    assert notification["locations"][0]["physicalLocation"]["region"]["startLine"] == 3


def test_sarif_regions_are_one_based_and_count_utf16_units() -> None:
    source = "x = 1  # 😀\ny = '😀'; kl = low_var_kl(a, b)\n"
    line = source.splitlines()[1]
    column = line.index("low_var_kl") + 1
    lint = LintResult(
        [finding("KL002", "t.py", 2, column, span=16)], [], 1, sources={"t.py": source}
    )
    region = sarif(lint)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert region["startColumn"] == column + 1  # the emoji is two UTF-16 code units
    assert region["endColumn"] == column + 17
    assert min(region.values()) >= 1


def test_sarif_fingerprint_survives_lines_shifting_but_not_edits() -> None:
    def fingerprint(source: str, line: int) -> str:
        lint = LintResult([finding("KL002", "t.py", line, 6)], [], 1, sources={"t.py": source})
        result = sarif(lint)["runs"][0]["results"][0]
        return str(result["partialFingerprints"]["primaryLocationLineHash"])

    original = fingerprint("kl = low_var_kl(a, b)\n", 1)
    assert fingerprint("import torch\n\nkl = low_var_kl(a, b)\n", 3) == original
    assert fingerprint("kl = low_var_kl(a, c)\n", 1) != original


def test_sarif_numbers_identical_lines() -> None:
    source = "kl = low_var_kl(a, b)\nkl = low_var_kl(a, b)\n"
    lint = LintResult(
        [finding("KL002", "t.py", n, 6) for n in (1, 2)], [], 1, sources={"t.py": source}
    )
    hashes = [
        r["partialFingerprints"]["primaryLocationLineHash"]
        for r in sarif(lint)["runs"][0]["results"]
    ]
    assert hashes[0].endswith(":1") and hashes[1].endswith(":2")
    assert hashes[0][:-2] == hashes[1][:-2]


def test_sarif_rule_help_comes_from_the_rule_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "KL002.md").write_text(PAGE)
    monkeypatch.setattr("kllint.rulebook.page_dirs", lambda: [tmp_path])
    rules = sarif(result())["runs"][0]["tool"]["driver"]["rules"]
    k2 = rules[list(RULES).index("KL002")]
    assert k2["help"]["markdown"] == PAGE
    assert k2["fullDescription"]["text"] == "Flags `low_var_kl(...)` when it reaches a loss."
    assert rules[0]["help"]["text"] == RULES["KL001"].summary  # no page: the summary


PAGE = """\
# differentiated-k3-estimate (KL002)

## What it does
Flags `low_var_kl(...)` when it reaches a loss.

## Example
```python
## not a heading: a comment in the example
loss = low_var_kl(logp, ref_logp).mean()
```

## Use instead
Use k2.
"""


def test_parse_sections_splits_at_headings_outside_code() -> None:
    sections = parse_sections(PAGE)
    assert list(sections) == ["", "What it does", "Example", "Use instead"]
    assert sections[""] == "# differentiated-k3-estimate (KL002)"
    assert "## not a heading" in sections["Example"]
    assert sections["Use instead"] == "Use k2."


def with_notes() -> LintResult:
    r = result()
    r.findings[1].notes = ["the selector `kl_type` resolves to 'low_var_kl'", "k3 reaches the loss"]
    return r


def test_full_shows_notes_indented_under_the_finding() -> None:
    text = render(with_notes(), "full")
    assert (
        "  |\n"
        "  = note: the selector `kl_type` resolves to 'low_var_kl'\n"
        "  = note: k3 reaches the loss\n"
        "  = help: Use the k2 estimate 0.5 * log_ratio**2\n"
    ) in text


def test_concise_leaves_notes_out() -> None:
    assert render(with_notes(), "concise") == render(result(), "concise")


def test_json_and_sarif_carry_notes() -> None:
    entries = json.loads(render(with_notes(), "json"))
    assert entries[1]["notes"] == [
        "the selector `kl_type` resolves to 'low_var_kl'",
        "k3 reaches the loss",
    ]
    [first, _] = json.loads(render(with_notes(), "sarif"))["runs"][0]["results"]
    assert first["properties"]["notes"] == entries[1]["notes"]
    assert "Note: k3 reaches the loss" in first["message"]["text"]


def test_summary_is_markdown_with_counts_and_links(monkeypatch: pytest.MonkeyPatch) -> None:
    from kllint.reporters import summary

    environ = {
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "acme/rl",
        "GITHUB_SHA": "abc123",
    }
    text = summary.render(result(), environ)
    assert text.startswith("## kllint\n\n**2 findings and 1 file that could not be checked**")
    assert "| KL002 | `differentiated-k3-estimate` | 1 |" in text
    assert "| [`train.py`](https://github.com/acme/rl/blob/abc123/train.py) | 2 |" in text
    assert (
        "- [`train.py:4:10`](https://github.com/acme/rl/blob/abc123/train.py#L4) **KL002** "
        "`differentiated-k3-estimate` k3 is differentiated: its gradient is that of "
        "KL(ref\\|\\|pi), 100% reversed"
    ) in text
    # Without GitHub's variables, plain paths.
    assert "- `train.py:5:12` **KL005**" in summary.render(result(), {})


def test_summary_when_clean() -> None:
    clean = LintResult(findings=[], errors=[], files_checked=3)
    assert render(clean, "summary") == "## kllint\n\nAll checks passed! (3 files checked)\n"


def test_statistics_counts_per_rule() -> None:
    from kllint.reporters.text import statistics

    assert statistics(result()) == (
        "1  E999  file-error\n1  KL002  differentiated-k3-estimate\n1  KL005  kl-loss-without-gradient\n"
    )
