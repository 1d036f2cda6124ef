"""Notebooks: linted cell by cell as one module, reported by cell, rewritten
without touching outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_analysis import flag_markers

from kllint.cli import main
from kllint.engine import lint_paths
from kllint.notebook import (
    Notebook,
    NotebookError,
    file_line,
    python_lines,
    replace_cell_source,
)


def notebook(*cells: tuple[str, str], language: str = "python") -> str:
    """nbformat 4 as Jupyter writes it: one-space indent, sources as lists of lines."""
    document = {
        "cells": [
            {
                "cell_type": kind,
                "metadata": {},
                "source": source.splitlines(keepends=True),
                **(
                    {"execution_count": 1, "outputs": [{"output_type": "stream", "text": ["ok\n"]}]}
                    if kind == "code"
                    else {}
                ),
            }
            for kind, source in cells
        ],
        "metadata": {"language_info": {"name": language}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1) + "\n"


GRPO = notebook(
    ("markdown", "# GRPO\n"),
    ("code", "%matplotlib inline\n!pip install trl\nimport torch\n"),
    ("code", "def loss_fn(logp, ref_logp):\n    kl = low_var_kl(logp, ref_logp)\n    return kl\n"),
)


@pytest.fixture(autouse=True)
def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("kllint.engine.check_source", flag_markers)


def test_code_cells_become_one_module_with_magics_as_pass() -> None:
    nb = Notebook.parse(GRPO)
    assert nb.code.splitlines() == [
        "pass",
        "pass",
        "import torch",
        "def loss_fn(logp, ref_logp):",
        "    kl = low_var_kl(logp, ref_logp)",
        "    return kl",
    ]
    # Cells are numbered in the file, the markdown cell included.
    assert nb.locate(5) == (3, 2)
    assert nb.locate(1) == (2, 1)


@pytest.mark.parametrize(
    ("line", "python"),
    [
        ("!ls", "pass"),
        ("    %time step()", "    pass"),  # a block keeps its body
        ("files = !ls", "pass"),
        ("a, b = %who_ls", "pass"),
        ("torch.exp?", "pass"),
        ("kl = 0.5 * log_ratio**2", "kl = 0.5 * log_ratio**2"),
        ("x = a % b", "x = a % b"),
    ],
)
def test_ipython_lines(line: str, python: str) -> None:
    assert python_lines(line) == [python + "\n"]


def test_a_cell_magic_blanks_its_cell() -> None:
    assert python_lines("%%bash\necho low_var_kl(\n") == ["\n", "\n"]


def test_findings_are_reported_by_cell_and_line() -> None:
    Path("grpo.ipynb").write_text(GRPO)
    result = CliRunner().invoke(main, ["grpo.ipynb"])
    assert result.exit_code == 1
    assert result.output.splitlines()[:4] == [
        "grpo.ipynb:cell 3:2:10: KL002 [differentiated-k3-estimate] differentiated-k3-estimate here",
        "  |",
        "2 |     kl = low_var_kl(logp, ref_logp)",  # the snippet is the cell's line
        "  |          " + "^" * len("low_var_kl(logp, ref_logp)"),
    ]
    [entry] = json.loads(CliRunner().invoke(main, ["--format", "json", "grpo.ipynb"]).output)
    assert (entry["cell"], entry["line"], entry["column"]) == (3, 2, 10)


def test_directories_include_notebooks() -> None:
    Path("nb").mkdir()
    Path("nb/grpo.ipynb").write_text(GRPO)
    assert [(f.path, f.cell) for f in lint_paths(["."]).findings] == [("nb/grpo.ipynb", 3)]


def test_noqa_in_a_cell() -> None:
    Path("grpo.ipynb").write_text(GRPO.replace("ref_logp)\\n", "ref_logp)  # noqa: KL002\\n"))
    assert lint_paths(["grpo.ipynb"]).findings == []


def test_syntax_error_is_placed_in_its_cell() -> None:
    Path("bad.ipynb").write_text(notebook(("code", "import torch\n"), ("code", "kl = (\n")))
    [error] = lint_paths(["bad.ipynb"]).errors
    assert (error.cell, error.line) == (2, 1)


def test_not_a_notebook_is_a_file_error() -> None:
    Path("broken.ipynb").write_text("{not json")
    [error] = lint_paths(["broken.ipynb"]).errors
    assert error.message.startswith("not a notebook: invalid JSON")


def test_other_kernels_are_not_python() -> None:
    Path("r.ipynb").write_text(notebook(("code", "low_var_kl(x)\n"), language="R"))
    assert lint_paths(["r.ipynb"]).findings == []


def test_replace_cell_source_keeps_everything_else() -> None:
    new = replace_cell_source(GRPO, 3, "def loss_fn(logp, ref_logp):\n    return 0\n")
    before, after = json.loads(GRPO), json.loads(new)
    assert after["cells"][2]["source"] == ["def loss_fn(logp, ref_logp):\n", "    return 0\n"]
    assert after["cells"][2]["outputs"] == before["cells"][2]["outputs"]
    after["cells"][2]["source"] = before["cells"][2]["source"]
    assert after == before
    # Unchanged text round-trips byte for byte (indent, key order, final newline).
    assert replace_cell_source(GRPO, 3, Notebook.parse(GRPO).cell_code(3)) == GRPO


def test_replace_cell_source_of_a_missing_cell() -> None:
    with pytest.raises(NotebookError, match="no cell 9"):
        replace_cell_source(GRPO, 9, "")


def test_file_line_finds_a_cell_line_in_the_json() -> None:
    lines = GRPO.splitlines()
    number = file_line(GRPO, 3, 2)
    assert number is not None
    assert lines[number - 1] == '    "    kl = low_var_kl(logp, ref_logp)\\n",'
    compact = json.dumps(json.loads(GRPO))  # one line: nothing to point at
    assert file_line(compact, 3, 2) is None


def test_github_and_sarif_mark_the_notebook_files_own_line() -> None:
    Path("grpo.ipynb").write_text(GRPO)
    number = file_line(GRPO, 3, 2)
    github = CliRunner().invoke(main, ["--output-format", "github", "grpo.ipynb"]).output
    assert github.startswith(
        f"::error file=grpo.ipynb,line={number},endLine={number},"
        "title=kllint (KL002) cell 3::cell 3, line 2: "
    )
    sarif = json.loads(CliRunner().invoke(main, ["--output-format", "sarif", "grpo.ipynb"]).output)
    [result] = sarif["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"] == {
        "startLine": number,
        "endLine": number,
    }
    assert result["properties"]["cell"] == 3
