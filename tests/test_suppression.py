"""``# noqa`` and ``# kllint: ignore``: which comments silence which findings."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_analysis import finding, flag_markers

from kllint.engine import lint_paths
from kllint.suppression import (
    is_suppressed,
    might_suppress,
    parse_comments,
    parse_suppressions,
    stale_suppressions,
    with_noqa,
)


@pytest.fixture(autouse=True)
def _fake_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kllint.engine.check_source", flag_markers)


@pytest.mark.parametrize(
    "comment",
    [
        "# noqa",
        "# NOQA",
        "#noqa",
        "# noqa: KL002",
        "# noqa:KL002",
        "# noqa: KL001,KL002",
        "# noqa: KL001, KL002",
        "# noqa: differentiated-k3-estimate",
        "# kllint: ignore",
        "# kllint: ignore[KL002]",
        "# kllint: ignore[KL005, differentiated-k3-estimate]",
        "# type: ignore[attr-defined]  # noqa: KL002",
    ],
)
def test_comment_silences_k3_finding(comment: str) -> None:
    source = f"kl = low_var_kl(logp, ref_logp)  {comment}\n"
    assert is_suppressed(finding("KL002", line=1), parse_suppressions(source))


@pytest.mark.parametrize(
    "comment",
    [
        "# noqa: KL001",  # another rule
        "# noqa: E501",  # another tool's code
        "# noqa: KL",  # prefixes select rules, they do not silence them (as in Ruff)
        "# kllint: ignore[KL005]",
        "# noqa-ish remark",
        "# see the kllint docs",
    ],
)
def test_comment_leaves_k3_finding(comment: str) -> None:
    source = f"kl = low_var_kl(logp, ref_logp)  {comment}\n"
    assert not is_suppressed(finding("KL002", line=1), parse_suppressions(source))


def test_noqa_inside_a_string_is_not_a_comment() -> None:
    source = 'label = "kl  # noqa"; kl = low_var_kl(logp, ref_logp)\n'
    assert parse_suppressions(source) == {}


def test_noqa_on_the_last_line_of_a_multiline_finding() -> None:
    source = "loss = (\n    low_var_kl(logp, ref_logp)\n    .mean()\n)  # noqa: KL002\n"
    multiline = finding("KL002", line=2, column=5, end_line=4, end_column=2)
    assert is_suppressed(multiline, parse_suppressions(source))


def test_noqa_on_a_middle_line_does_not_count() -> None:
    source = "loss = (\n    low_var_kl(logp, ref_logp)  # noqa\n    .mean()\n)\n"
    multiline = finding("KL002", line=1, column=8, end_line=4, end_column=2)
    assert not is_suppressed(multiline, parse_suppressions(source))


def test_comments_before_a_tokenize_error_still_count() -> None:
    source = "kl = low_var_kl(a, b)  # noqa\nx = (\n"
    assert parse_suppressions(source) == {1: None}


def test_lint_drops_silenced_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text(
        "a = low_var_kl(logp, ref_logp)\n"
        "b = low_var_kl(logp, ref_logp)  # noqa: KL002\n"
        "c = low_var_kl(logp, ref_logp)  # noqa: KL001\n"
        'd = "# noqa"; e = low_var_kl(logp, ref_logp)\n'
    )
    result = lint_paths(["train.py"])
    assert [f.line for f in result.findings] == [1, 3, 4]


def stale(source: str, enabled: tuple[str, ...] = ("KL001", "KL002", "KL005")) -> list[str]:
    findings = flag_markers(source, "train.py", None, None)
    warnings = stale_suppressions(parse_comments(source), findings, enabled, "train.py")
    return [f"{w.line}:{w.column}: {w.message}" for w in warnings]


def test_a_noqa_that_silences_something_is_not_stale() -> None:
    assert stale("kl = low_var_kl(logp, ref_logp)  # noqa: KL002\n") == []


def test_a_kl_code_that_silences_nothing_is_stale() -> None:
    assert stale("kl = 0.5 * log_ratio**2  # noqa: KL002\n") == [
        "1:26: unused suppression: KL002 silences nothing on this line"
    ]
    assert stale("kl = 0.5 * log_ratio**2  # kllint: ignore\n") == [
        "1:26: unused suppression: kllint: ignore silences nothing on this line"
    ]


def test_an_unknown_kl_code_is_reported() -> None:
    assert stale("kl = low_var_kl(logp, ref_logp)  # noqa: KL02\n") == [
        "1:34: unknown rule 'KL02' in a suppression comment (see `kllint rules`)"
    ]


def test_other_tools_codes_and_rules_not_enabled_are_left_alone() -> None:
    assert stale("import os  # noqa: F401\nx = 1  # noqa\n") == []
    # --select KL001: KL002 might report here on a full run; the comment is not stale.
    assert stale("kl = 0.5 * log_ratio**2  # noqa: KL002\n", enabled=("KL001",)) == []


def test_without_findings_only_comments_that_can_be_stale_are_read() -> None:
    # Model code is full of other tools' noqa; in a file with nothing to
    # report, only a comment naming a kllint rule can give a warning.
    assert not might_suppress("import os  # noqa: F401\nx = 1  # noqa\n", findings=False)
    assert might_suppress("import os  # noqa: F401\nx = 1  # noqa\n", findings=True)
    assert might_suppress("x = 1  # noqa: E501, KL002\n", findings=False)
    assert might_suppress("x = 1  # noqa: differentiated-k3-estimate\n", findings=False)
    assert might_suppress("x = 1  # kllint: ignore\n", findings=False)


def test_stale_comments_reach_the_run_as_warnings(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("kl = 0.5 * log_ratio**2  # noqa: KL002\n")
    result = lint_paths([tmp_path / "train.py"])
    assert result.findings == []
    assert [w.message for w in result.warnings] == [
        "unused suppression: KL002 silences nothing on this line"
    ]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("kl = low_var_kl(x)\n", "kl = low_var_kl(x)  # noqa: KL002\n"),
        ("kl = low_var_kl(x)  # noqa: KL001\n", "kl = low_var_kl(x)  # noqa: KL001, KL002\n"),
        ("kl = low_var_kl(x)  # noqa\n", "kl = low_var_kl(x)  # noqa\n"),
        ("kl = low_var_kl(x)  # why\n", "kl = low_var_kl(x)  # why  # noqa: KL002\n"),
    ],
)
def test_with_noqa(source: str, expected: str) -> None:
    assert with_noqa(source, {1: ["KL002"]}) == (expected, [])


def test_with_noqa_refuses_lines_inside_a_string() -> None:
    source = 'doc = """\nlow_var_kl(x)\n"""\n'
    assert with_noqa(source, {2: ["KL002"]}) == (source, [2])
