"""The ``kllint`` command as a user runs it: output and exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fake_analysis import flag_markers

from kllint import __version__
from kllint import cli as cli_module
from kllint.cli import main
from kllint.findings import Finding
from kllint.rules import RULES

K3_LOSS = "def loss_fn(logp, ref_logp):\n    return low_var_kl(logp, ref_logp).mean()\n"
CLEAN = "def loss_fn(logp, ref_logp):\n    return (logp - ref_logp).pow(2).mean() / 2\n"


@pytest.fixture(autouse=True)
def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("kllint.engine.check_source", flag_markers)


def kllint(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def test_clean_code_exits_0() -> None:
    write("ppo.py", CLEAN)
    result = kllint("ppo.py")
    assert result.exit_code == 0
    assert result.output == "All checks passed!\n"


def test_findings_exit_1() -> None:
    write("grpo.py", K3_LOSS)
    result = kllint("grpo.py")
    assert result.exit_code == 1
    assert "grpo.py:2:12: KL002 [differentiated-k3-estimate]" in result.output
    assert "Found 1 finding (KL002: 1)." in result.output


def test_exit_zero_reports_but_exits_0() -> None:
    write("grpo.py", K3_LOSS)
    result = kllint("--exit-zero", "grpo.py")
    assert result.exit_code == 0
    assert "KL002" in result.output


def test_default_path_is_the_working_directory() -> None:
    write("rl/grpo.py", K3_LOSS)
    result = kllint("--format", "concise")
    assert result.output.startswith("rl/grpo.py:2:12: KL002")


def test_paths_under_the_working_directory_are_shown_relative(tmp_path: Path) -> None:
    write("rl/grpo.py", K3_LOSS)
    result = kllint("--format", "concise", str(tmp_path / "rl"))
    assert result.output.startswith("rl/grpo.py:2:12: KL002")


def test_syntax_error_is_reported_and_other_files_still_linted() -> None:
    write("broken.py", "def loss_fn(logp:\n    return logp\n")
    write("grpo.py", K3_LOSS)
    result = kllint("--format", "concise", ".")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "broken.py:1:12: E999 SyntaxError: '(' was never closed",
        "grpo.py:2:12: KL002 [differentiated-k3-estimate] differentiated-k3-estimate here",
        "Found 1 finding (KL002: 1). 1 file could not be checked.",
    ]


def test_syntax_error_alone_exits_1_as_in_ruff() -> None:
    write("broken.py", "kl_loss = (\n")
    result = kllint("broken.py")
    assert result.exit_code == 1
    assert "E999 SyntaxError" in result.output


def test_file_that_is_not_utf8_is_reported() -> None:
    Path("latin1.py").write_bytes(b"name = '\xe9'\n")
    result = kllint("latin1.py")
    assert result.exit_code == 1
    assert "latin1.py:1:1: E999 UnicodeDecodeError: not valid UTF-8" in result.output


def test_a_pep_263_coding_declaration_is_honoured() -> None:
    Path("latin1.py").write_bytes(b"# coding: latin-1\nname = '\xe9'\n" + K3_LOSS.encode())
    result = kllint("--format", "concise", "latin1.py")
    assert result.exit_code == 1
    assert "latin1.py:4:12: KL002" in result.output


def test_missing_path_exits_2_with_a_message_and_no_traceback() -> None:
    write("grpo.py", K3_LOSS)
    result = kllint("grpo.py", "missing.py")
    assert result.exit_code == 2
    assert result.output == "kllint: error: no such file or directory: missing.py\n"


def test_bad_config_key_exits_2() -> None:
    write("pyproject.toml", '[tool.kllint]\nselct = ["KL002"]\n')
    write("grpo.py", K3_LOSS)
    result = kllint("grpo.py")
    assert result.exit_code == 2
    assert "pyproject.toml: [tool.kllint]: unknown key 'selct'" in result.output
    assert "Traceback" not in result.output


def test_config_from_an_explicit_file() -> None:
    write("ci/strict.toml", '[tool.kllint]\nignore = ["KL002"]\n')
    write("grpo.py", K3_LOSS)
    assert kllint("--config", "ci/strict.toml", "grpo.py").exit_code == 0
    assert kllint("--config", "ci/missing.toml", "grpo.py").exit_code == 2


@pytest.mark.parametrize(
    ("args", "codes"),
    [
        ([], ["KL001", "KL002", "KL005"]),
        (["--select", "KL002"], ["KL002"]),
        (["--select", "KL001,KL005"], ["KL001", "KL005"]),
        (["--select", "KL001", "--select", "differentiated-k3-estimate"], ["KL001", "KL002"]),
        (["--ignore", "KL00"], []),
        (["--ignore", "kl-loss-without-gradient,KL001"], ["KL002"]),
        (["--select", "KL", "--ignore", "KL002"], ["KL001", "KL005"]),
    ],
)
def test_select_and_ignore(args: list[str], codes: list[str]) -> None:
    write("losses.py", "a = k1_loss(x)\nb = low_var_kl(x)\nc = kl_no_grad(x)\n")
    result = kllint("--format", "json", *args, "losses.py")
    assert [f["code"] for f in json.loads(result.output)] == codes


def test_unknown_rule_on_the_command_line_exits_2() -> None:
    result = kllint("--select", "KL9", ".")
    assert result.exit_code == 2
    assert result.output == "kllint: error: --select: unknown rule 'KL9' (see `kllint rules`)\n"


def test_unknown_option_is_a_usage_error() -> None:
    assert kllint("--fromat", "json").exit_code == 2


def test_crash_in_the_analysis_exits_2_but_other_files_are_linted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def crash_on_odd(source: str, path: str, project: object, roles: object) -> list[Finding]:
        if "odd" in path:
            raise KeyError("reference_logp")
        return flag_markers(source, path, project, roles)

    monkeypatch.setattr("kllint.engine.check_source", crash_on_odd)
    write("odd.py", CLEAN)
    write("grpo.py", K3_LOSS)
    result = kllint("--exit-zero", "--format", "concise", ".")
    assert result.exit_code == 2
    assert "grpo.py:2:12: KL002" in result.output
    assert "odd.py:1:1: E998 internal error: KeyError: 'reference_logp'" in result.output
    assert "Traceback" not in result.output


def test_no_python_files_is_a_warning_not_an_error() -> None:
    write("README.md", "# RL\n")
    result = kllint(".")
    assert result.exit_code == 0
    assert "kllint: warning: no Python files found" in result.output


def test_rule_prints_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "KL002.md").write_text(
        "# differentiated-k3-estimate (KL002)\n\n## What it does\n"
    )
    monkeypatch.setattr("kllint.rulebook.page_dirs", lambda: [tmp_path / "book"])
    for spelling in ["KL002", "kl002", "differentiated-k3-estimate"]:
        result = kllint("rule", spelling)
        assert result.exit_code == 0
        assert result.output == "# differentiated-k3-estimate (KL002)\n\n## What it does\n"


def test_rule_without_a_page_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kllint.rulebook.page_dirs", lambda: [tmp_path / "nowhere"])
    result = kllint("rule", "KL002")
    assert result.exit_code == 0
    assert RULES["KL002"].summary in result.output
    assert "The full page for KL002 is missing" in result.output


def test_rule_unknown_or_ambiguous_exits_2() -> None:
    assert kllint("rule", "KL042").output == (
        "kllint: error: unknown rule 'KL042' (see `kllint rules`)\n"
    )
    result = kllint("rule", "KL00")
    assert result.exit_code == 2
    assert "matches several rules (KL001, KL002, KL003, KL004, KL005, KL006)" in result.output


def test_rules_lists_code_name_and_summary() -> None:
    result = kllint("rules")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert [line.split()[:2] for line in lines] == [[r.code, r.name] for r in RULES.values()]
    assert lines[1].endswith(RULES["KL002"].summary)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    result = kllint(flag)
    assert result.exit_code == 0
    assert result.output == f"kllint {__version__}\n"


def test_confirm_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    write("grpo.py", K3_LOSS)
    result = kllint("--confirm", "grpo.py")
    assert result.exit_code == 2
    assert result.output == "kllint: --confirm needs torch: pip install 'kllint[confirm]'\n"


def test_confirm_attaches_the_harness_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    def confirm_findings(findings: list[Finding]) -> list[Finding]:
        for f in findings:
            f.confirmation = {"verdict": "confirmed"}
        return findings

    harness = types.ModuleType("kllint.harness")
    harness.confirm_findings = confirm_findings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "kllint.harness", harness)
    write("grpo.py", K3_LOSS)
    result = kllint("--confirm", "--format", "json", "grpo.py")
    assert result.exit_code == 1
    assert json.loads(result.output)[0]["confirmation"] == {"verdict": "confirmed"}
    assert "= confirmation: confirmed" in kllint("--confirm", "grpo.py").output


def test_python_dash_m_kllint() -> None:
    checkout = Path(cli_module.__file__).parents[1]  # importable even when not installed
    run = subprocess.run(
        [sys.executable, "-m", "kllint", "rules"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )
    assert run.returncode == 0
    assert run.stdout.startswith("KL001  differentiated-k1-estimate")


def test_group_help_lists_every_command() -> None:
    result = kllint("--help")
    assert result.exit_code == 0
    commands = result.output.split("Commands:\n")[1].split("\n\n")[0]
    assert {line.split()[0] for line in commands.splitlines()} == {
        "check",
        "estimators",
        "rule",
        "rules",
    }
    assert "`kllint PATH` is short for `kllint check PATH`" in result.output


def test_check_is_the_long_form() -> None:
    write("grpo.py", K3_LOSS)
    assert kllint("check", "grpo.py").output == kllint("grpo.py").output


@pytest.mark.parametrize("flag", ["--format", "--output-format"])
def test_output_format_as_ruff_spells_it(flag: str) -> None:
    write("grpo.py", K3_LOSS)
    result = kllint(flag, "json", "grpo.py")
    assert json.loads(result.output)[0]["code"] == "KL002"


def test_output_file() -> None:
    write("grpo.py", K3_LOSS)
    result = kllint("--output-format", "sarif", "--output-file", "out/kllint.sarif", "grpo.py")
    assert result.exit_code == 2  # no such directory: a clear error, not a traceback
    assert result.output.startswith("kllint: error: cannot write out/kllint.sarif")
    Path("out").mkdir()
    result = kllint("--output-format", "sarif", "-o", "out/kllint.sarif", "grpo.py")
    assert result.exit_code == 1
    assert result.output == ""
    assert json.loads(Path("out/kllint.sarif").read_text())["version"] == "2.1.0"


def test_statistics() -> None:
    write("losses.py", "a = low_var_kl(x)\nb = low_var_kl(y)\nc = k1_loss(x)\n")
    result = kllint("--statistics", "losses.py")
    assert result.exit_code == 1
    assert (
        result.output
        == "2  KL002  differentiated-k3-estimate\n1  KL001  differentiated-k1-estimate\n"
    )


def test_add_noqa_silences_every_finding_and_then_the_run_is_clean() -> None:
    write("losses.py", "a = low_var_kl(x)  # noqa: E501\nb = k1_loss(x)\n")
    result = kllint("--add-noqa", "losses.py")
    assert result.exit_code == 0
    assert result.output == "Added 2 noqa directives.\n"
    assert Path("losses.py").read_text() == (
        "a = low_var_kl(x)  # noqa: E501, KL002\nb = k1_loss(x)  # noqa: KL001\n"
    )
    assert kllint("losses.py").exit_code == 0


def test_add_noqa_in_a_notebook_keeps_outputs() -> None:
    from test_notebook import GRPO

    write("grpo.ipynb", GRPO)
    assert kllint("--add-noqa", "grpo.ipynb").exit_code == 0
    cell = json.loads(Path("grpo.ipynb").read_text())["cells"][2]
    assert cell["source"][1] == "    kl = low_var_kl(logp, ref_logp)  # noqa: KL002\n"
    assert cell["outputs"] == json.loads(GRPO)["cells"][2]["outputs"]
    assert kllint("grpo.ipynb").exit_code == 0


def test_stale_noqa_is_a_warning_on_stderr_and_does_not_fail() -> None:
    write("ppo.py", "kl = 0.5 * log_ratio**2  # noqa: KL002\n")
    result = CliRunner().invoke(main, ["ppo.py"])
    assert result.exit_code == 0
    assert result.stdout == "All checks passed!\n"
    assert result.stderr == (
        "kllint: warning: ppo.py:1:26: unused suppression: KL002 silences nothing on this line\n"
    )


def test_stdin() -> None:
    result = CliRunner().invoke(main, ["-"], input=K3_LOSS)
    assert result.exit_code == 1
    assert result.output.startswith("-:2:12: KL002")
    write("pyproject.toml", '[tool.kllint]\nper-file-ignores = { "tests/*" = ["KL002"] }\n')
    named = CliRunner().invoke(main, ["--stdin-filename", "rl/grpo.py", "-"], input=K3_LOSS)
    assert named.output.startswith("rl/grpo.py:2:12: KL002")
    ignored = CliRunner().invoke(main, ["--stdin-filename", "tests/test_grpo.py"], input=K3_LOSS)
    assert ignored.exit_code == 0


def test_stdin_cannot_be_mixed_with_paths() -> None:
    write("grpo.py", K3_LOSS)
    result = kllint("-", "grpo.py")
    assert result.exit_code == 2
    assert "cannot be combined" in result.output


@pytest.mark.parametrize(
    ("args", "environ", "colored"),
    [
        (["--color", "always"], {}, True),
        (["--color", "never"], {"FORCE_COLOR": "1"}, False),
        ([], {"FORCE_COLOR": "1"}, True),
        ([], {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        ([], {}, False),  # not a terminal
    ],
)
def test_color(
    args: list[str], environ: dict[str, str], colored: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    write("grpo.py", K3_LOSS)
    assert ("\x1b[" in CliRunner().invoke(main, [*args, "grpo.py"], color=True).output) == colored


def test_show_settings_and_show_files() -> None:
    write("pyproject.toml", '[tool.kllint]\nselect = ["KL002"]\nexclude = ["generated"]\n')
    write("rl/grpo.py", K3_LOSS)
    write("rl/analysis.ipynb", '{"cells": []}')
    write("generated/x.py", K3_LOSS)
    settings = kllint("--show-settings", "rl/grpo.py")
    assert settings.exit_code == 0
    assert "select = [KL002]\n" in settings.output
    assert "exclude = ['generated']\n" in settings.output
    files = kllint("--show-files")
    assert files.output == "rl/analysis.ipynb\nrl/grpo.py\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["estimators"], "kllint: estimators needs torch: pip install 'kllint[confirm]'\n"),
        (
            ["--confirm", "grpo.py"],
            "kllint: --confirm needs torch: pip install 'kllint[confirm]'\n",
        ),
    ],
)
def test_commands_that_need_torch_fail_in_one_line_without_it(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    write("grpo.py", K3_LOSS)
    result = kllint(*args)
    assert (result.exit_code, result.output) == (2, message)


def test_estimators_plot_needs_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = kllint("estimators", "--plot", "out.png")
    assert (result.exit_code, result.output) == (
        2,
        "kllint: --plot needs matplotlib: pip install 'kllint[plot]'\n",
    )


def test_progress_shows_elapsed_time_on_a_long_run_and_erases_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_module._Progress, "DELAY_S", 0.0)
    with cli_module._Progress(enabled=True) as progress:
        deadline = time.monotonic() + 30
        while not progress._shown and time.monotonic() < deadline:
            time.sleep(0.01)
    assert capsys.readouterr().err == "\rkllint: checking... 0s\r\x1b[K"
    with cli_module._Progress(enabled=False):  # stderr is not a terminal
        time.sleep(0.2)
    assert capsys.readouterr().err == ""


def test_force_exclude_and_gitignore_from_the_command_line() -> None:
    write("pyproject.toml", '[tool.kllint]\nexclude = ["generated"]\n')
    write("generated/grpo.py", K3_LOSS)
    assert kllint("generated/grpo.py").exit_code == 1
    assert kllint("--force-exclude", "generated/grpo.py").exit_code == 0
    Path(".git").mkdir()
    write(".gitignore", "outputs/\n")
    write("outputs/grpo.py", K3_LOSS)
    assert kllint("--show-files").output == ""
    assert kllint("--no-respect-gitignore", "--show-files").output == "outputs/grpo.py\n"
