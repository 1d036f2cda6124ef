"""Where kllint runs besides a terminal, each run for real on a throwaway
repository: the pre-commit hook (pre-commit installs it from a git revision
into a virtualenv of its own) and the GitHub Action (its steps executed by
bash as a runner would, with GitHub's files and variables).

Both install kllint with pip, which needs a package index (PyPI, or the
index pip is configured with); without one the tests skip."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kllint
from kllint.notebook import file_line

yaml = pytest.importorskip("yaml")

CHECKOUT = Path(kllint.__file__).resolve().parents[1]

# The real analysis runs here (no fake): k3 of the log-ratio differentiated as a loss.
GRPO = """\
import torch


def grpo_loss(policy_logp, ref_logp, advantages, beta=0.04):
    log_ratio = ref_logp - policy_logp
    kl = torch.exp(log_ratio) - log_ratio - 1
    pg = -advantages * torch.exp(policy_logp - policy_logp.detach())
    return (pg + beta * kl).mean()
"""
# A per-token k3 loss with a mask: --fix has a safe rewrite for it.
FIXABLE = """\
import torch


def grpo_loss(per_token_logps, ref_per_token_logps, completion_mask, beta):
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    return (beta * per_token_kl * completion_mask).sum(dim=1).mean()
"""
CLEAN = "def scale(rewards, beta):\n    return beta * rewards\n"
GIT = ["git", "-c", "user.name=kllint tests", "-c", "user.email=tests@kllint.invalid"]
GIT += ["-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]


def git(cwd: Path, *args: str) -> str:
    run = subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return run.stdout.strip()


@pytest.fixture(scope="module")
def package_index(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip when pip cannot reach an index (the build backend is fetched from one)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    dest = tmp_path_factory.mktemp("index-probe")
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), "hatchling"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if probe.returncode != 0:
        pytest.skip("no package index reachable: pip cannot install kllint offline")


def project(root: Path) -> Path:
    """A repository of RL code: one bug, one clean file, one excluded copy, a notebook."""
    root.mkdir()
    (root / "pyproject.toml").write_text('[tool.kllint]\nexclude = ["generated"]\n')
    (root / "grpo.py").write_text(GRPO)
    (root / "ppo.py").write_text(CLEAN)
    (root / "generated").mkdir()
    (root / "generated" / "grpo.py").write_text(GRPO)
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    cells = [{**cell, "source": ["!pip install trl\n"]}, {**cell, "source": GRPO.splitlines(True)}]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (root / "analysis.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")
    git(root, "init", "-q")
    return root


# ----------------------------------------------------------------- pre-commit


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """This working tree, committed into a repository of its own: pre-commit
    installs a hook from a revision, and the tree under test may be uncommitted."""
    dest = tmp_path_factory.mktemp("kllint-hooks")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = CHECKOUT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "snapshot")
    return dest, git(dest, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def pre_commit(
    package_index: None, hook_repo: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    pytest.importorskip("pre_commit")
    root = project(tmp_path_factory.mktemp("pre-commit") / "project")
    (root / "fixme.py").write_text(FIXABLE)  # for the fixing hook
    repo, rev = hook_repo
    hooks = [{"id": "kllint"}, {"id": "kllint-fix", "stages": ["manual"]}]
    config = {"repos": [{"repo": str(repo), "rev": rev, "hooks": hooks}]}
    (root / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    git(root, "add", "-A")
    # The hook's virtualenv is built once for the module, in a cache of its own.
    cache = tmp_path_factory.mktemp("pre-commit-home")

    def run(*args: str, hook: str = "kllint") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "run", hook, "--color", "never", *args],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PRE_COMMIT_HOME": str(cache)},
            timeout=900,
        )

    yield run


def test_pre_commit_hook_fails_on_a_file_with_a_finding(pre_commit: Any) -> None:
    run = pre_commit("--files", "grpo.py")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "kllint" in run.stdout and "Failed" in run.stdout
    assert "grpo.py:6:10: KL002 [differentiated-k3-estimate]" in run.stdout


def test_pre_commit_hook_passes_a_clean_file(pre_commit: Any) -> None:
    run = pre_commit("--files", "ppo.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Passed" in run.stdout


def test_pre_commit_hook_skips_excluded_files_and_checks_notebooks(pre_commit: Any) -> None:
    run = pre_commit("--files", "generated/grpo.py")
    assert run.returncode == 0, run.stdout + run.stderr  # --force-exclude
    run = pre_commit("--all-files")
    assert run.returncode == 1
    assert "analysis.ipynb:cell 2:6:10: KL002" in run.stdout
    assert "grpo.py:6:10: KL002" in run.stdout
    assert "generated/" not in run.stdout


def test_pre_commit_fix_hook_rewrites_the_file_and_fails_once(pre_commit: Any) -> None:
    run = pre_commit("--files", "fixme.py", "--hook-stage", "manual", hook="kllint-fix")
    # pre-commit fails a hook that changed a file: the fix is left to review.
    assert run.returncode == 1, run.stdout + run.stderr
    assert "files were modified by this hook" in run.stdout
    run = pre_commit("--files", "fixme.py", "--hook-stage", "manual", hook="kllint-fix")
    assert run.returncode == 0, run.stdout + run.stderr  # fixed: nothing left to report


# ----------------------------------------------------------------- the Action

EXPRESSION = re.compile(r"\$\{\{\s*(inputs|github)\.([\w-]+)\s*\}\}")


class Runner:
    """Runs the action's steps as GitHub's runner does: each `run` with
    `bash --noprofile --norc -eo pipefail`, `${{ }}` expressions evaluated in
    `env:`, variables appended to $GITHUB_ENV passed to later steps."""

    def __init__(self, workspace: Path, temp: Path) -> None:
        self.action = yaml.safe_load((CHECKOUT / "action.yml").read_text())
        self.workspace = workspace
        self.summary = temp / "step_summary.md"
        self.env = {
            **os.environ,
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_ACTION_PATH": str(CHECKOUT),
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "acme/rl",
            "GITHUB_SHA": "0123abc",
            "GITHUB_STEP_SUMMARY": str(self.summary),
            "GITHUB_ENV": str(temp / "github_env"),
            "RUNNER_TEMP": str(temp),
        }
        Path(self.env["GITHUB_ENV"]).write_text("")

    def run(self, only: str | None = None, **inputs: str) -> subprocess.CompletedProcess[str]:
        declared = self.action["inputs"]
        assert set(inputs) <= {name.replace("-", "_") for name in declared}
        values = {
            n: inputs.get(n.replace("-", "_"), d.get("default", "")) for n, d in declared.items()
        }
        context = {"inputs": values, "github": {"action_path": str(CHECKOUT)}}
        run = None
        for step in self.action["runs"]["steps"]:
            if only is not None and step["name"] != only:
                continue
            # Inputs reach a script through env only (no shell injection).
            assert "${{" not in step["run"], step["name"]
            env = {
                k: EXPRESSION.sub(lambda m: str(context[m[1]][m[2]]), str(v))
                for k, v in step.get("env", {}).items()
            }
            run = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                cwd=self.workspace,
                env={**self.env, **env},
                capture_output=True,
                text=True,
                check=False,
                timeout=900,
            )
            if run.returncode != 0:
                return run
            for line in Path(self.env["GITHUB_ENV"]).read_text().splitlines():
                key, _, value = line.partition("=")
                self.env[key] = value
        assert run is not None
        return run


@pytest.fixture(scope="module")
def action(package_index: None, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    workspace = project(tmp_path_factory.mktemp("action") / "repo")
    runner = Runner(workspace, tmp_path_factory.mktemp("runner-temp"))
    install = runner.run(only="Install kllint")
    assert install.returncode == 0, install.stdout + install.stderr
    return runner


def test_action_annotates_summarises_and_writes_sarif(action: Runner) -> None:
    sarif = action.workspace / "kllint.sarif"
    run = action.run(only="Run kllint", sarif_file=str(sarif))
    assert run.returncode == 1, run.stderr  # findings fail the step
    annotations = [line for line in run.stdout.splitlines() if line.startswith("::")]
    # A notebook's mark is on the line of the .ipynb file that holds the cell's line.
    notebook_line = file_line((action.workspace / "analysis.ipynb").read_text(), 2, 6)
    assert [a.split("::")[1].split(",title=")[0] for a in annotations] == [
        f"error file=analysis.ipynb,line={notebook_line},endLine={notebook_line}",
        "error file=grpo.py,line=6,col=10,endLine=6,endColumn=46",
    ]
    summary = action.summary.read_text()
    assert summary.startswith("## kllint\n\n**2 findings** in 3 checked files.")
    assert "| KL002 | `differentiated-k3-estimate` | 2 |" in summary
    assert "[`grpo.py:6:10`](https://github.com/acme/rl/blob/0123abc/grpo.py#L6)" in summary
    results = json.loads(sarif.read_text())["runs"][0]["results"]
    assert [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results] == [
        "analysis.ipynb",
        "grpo.py",
    ]


def test_action_passes_clean_paths_and_takes_args(action: Runner) -> None:
    assert action.run(only="Run kllint", paths="ppo.py").returncode == 0
    assert action.run(only="Run kllint", args="--ignore KL002").returncode == 0
    bad = action.run(only="Run kllint", args="--select KL9")
    assert bad.returncode == 2
    assert "unknown rule 'KL9'" in bad.stderr
