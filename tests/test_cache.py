"""The results cache: a warm run reports what a cold run reports, re-analyses
exactly the files whose inputs changed, and survives corruption and
concurrent runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kllint import engine
from kllint.cache import CACHE_DIR_NAME, Cache
from kllint.cli import main
from kllint.config import load_settings

_real_check_source = engine.check_source


def _logged_check_source(source: str, path: str, project: object, roles: object) -> list:
    """The real analysis, noting which file it ran on (from any worker)."""
    with open(os.environ["KLLINT_TEST_ANALYSED"], "a", encoding="utf-8") as log:
        log.write(path + "\n")
    return _real_check_source(source, path, project, roles)  # type: ignore[arg-type]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package: ``train.py`` and ``rollout.py`` backpropagate a k3 loss
    helper of ``estimates.py`` (reported once, where it is written); ``data.py``
    uses nothing of it and backpropagates nothing (a file with a backward
    pass could become a caller of any helper: every helper judged by its
    callers depends on it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KLLINT_CACHE_DIR", raising=False)
    monkeypatch.setenv("KLLINT_TEST_ANALYSED", str(tmp_path / "analysed.log"))
    monkeypatch.setattr(engine, "check_source", _logged_check_source)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "estimates.py").write_text(
        "import torch\n\n\ndef divergence(policy_logp, ref_logp, mask):\n"
        "    kl = torch.exp(ref_logp - policy_logp) - (ref_logp - policy_logp) - 1\n"
        "    return (kl * mask).sum(-1).mean()\n"
    )
    for name in ("train", "rollout"):
        (package / f"{name}.py").write_text(
            textwrap.dedent(
                """\
                from pkg.estimates import divergence


                def step(policy_logp, ref_logp, mask):
                    loss = divergence(policy_logp, ref_logp, mask)
                    loss.backward()
                """
            )
        )
    (package / "data.py").write_text("def collate(batch, ref_logp):\n    return batch.sum()\n")
    return package


def run(*args: str) -> tuple[str, list[str]]:
    """The concise report and the files analysed (not taken from the cache)."""
    log = Path(os.environ["KLLINT_TEST_ANALYSED"])
    log.unlink(missing_ok=True)
    result = CliRunner().invoke(main, ["--format", "concise", "--exit-zero", *args])
    assert result.exit_code == 0, result.output
    analysed = sorted(Path(p).name for p in log.read_text().split()) if log.exists() else []
    return result.output, analysed


def test_a_warm_run_reports_the_same_without_analysing(project: Path) -> None:
    cold, analysed = run("pkg")
    assert analysed == ["data.py", "estimates.py", "rollout.py", "train.py"]
    assert "pkg/estimates.py:5:10: KL002" in cold  # where the estimator is written
    warm, analysed = run("pkg")
    assert (warm, analysed) == (cold, [])
    assert (Path(CACHE_DIR_NAME) / ".gitignore").read_text().endswith("*\n")


def test_the_json_report_is_the_same_warm(project: Path) -> None:
    cold = CliRunner().invoke(main, ["--format", "json", "pkg"]).output
    warm = CliRunner().invoke(main, ["--format", "json", "pkg"]).output
    assert json.loads(warm) == json.loads(cold) != []


def test_editing_a_helper_reanalyses_exactly_the_files_that_used_it(project: Path) -> None:
    run("pkg")
    estimates = project / "estimates.py"
    estimates.write_text(
        estimates.read_text().replace(
            "torch.exp(ref_logp - policy_logp) - (ref_logp - policy_logp) - 1",
            "policy_logp - ref_logp",
        )
    )
    output, analysed = run("pkg")
    assert analysed == ["estimates.py", "rollout.py", "train.py"]
    assert "KL002" not in output and "pkg/estimates.py:5:10: KL001" in output


def test_editing_a_file_reanalyses_only_that_file(project: Path) -> None:
    tools = project.parent / "tools"  # a script of its own, outside the package
    tools.mkdir()
    (tools / "plot.py").write_text((project / "data.py").read_text())
    run("pkg", "tools")
    (tools / "plot.py").write_text("# edited\n" + (tools / "plot.py").read_text())
    assert run("pkg", "tools")[1] == ["plot.py"]


def test_editing_any_file_of_the_package_reanalyses_the_helpers_judged_by_callers(
    project: Path,
) -> None:
    # Any file of the package could gain a backward pass over a helper's
    # result, so the files whose verdicts rest on the callers depend on all.
    run("pkg")
    (project / "data.py").write_text("# edited\n" + (project / "data.py").read_text())
    assert run("pkg")[1] == ["data.py", "estimates.py", "rollout.py", "train.py"]


def test_other_settings_do_not_share_results(project: Path) -> None:
    run("pkg")
    output, analysed = run("--select", "KL001", "pkg")
    assert len(analysed) == 4 and "KL002" not in output


def test_no_cache_neither_reads_nor_writes(project: Path) -> None:
    assert run("--no-cache", "pkg")[1] == run("--no-cache", "pkg")[1] != []
    assert not Path(CACHE_DIR_NAME).exists()


def test_kllint_cache_dir_moves_the_cache(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KLLINT_CACHE_DIR", str(project.parent / "elsewhere"))
    run("pkg")
    assert not Path(CACHE_DIR_NAME).exists() and (project.parent / "elsewhere").is_dir()


@pytest.mark.parametrize(
    "damage",
    [
        '{"format": 3, "files": {',  # truncated
        "\xff\xfe garbage",
        json.dumps({"format": 3, "files": {}, "depsets": {}, "entries": "nonsense"}),
        json.dumps({"format": 3, "files": {"a.py": [1]}, "depsets": {}, "entries": {}}),
    ],
)
def test_a_corrupt_cache_is_ignored_and_rebuilt(project: Path, damage: str) -> None:
    cold, _ = run("pkg")
    [index] = Path(CACHE_DIR_NAME).glob("*/index.json")
    index.write_text(damage, encoding="utf-8", errors="surrogateescape")
    output, analysed = run("pkg")
    assert output == cold and len(analysed) == 4
    assert run("pkg") == (cold, [])


def test_a_corrupt_entry_is_analysed_again(project: Path) -> None:
    cold, _ = run("pkg")
    [index] = Path(CACHE_DIR_NAME).glob("*/index.json")
    data = json.loads(index.read_text())
    [train] = [key for key in data["entries"] if key.endswith("train.py")]
    data["entries"][train]["findings"] = "nonsense"
    data["depsets"]["gone"] = "nonsense"
    index.write_text(json.dumps(data))
    assert run("pkg") == (cold, ["train.py"])


def test_a_warm_run_reads_only_files_with_findings(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Status unchanged: the cache knows the content without reading it.
    old = time.time() - 60
    for path in project.iterdir():
        os.utime(path, (old, old))
    cold, _ = run("pkg")
    read: list[str] = []
    real_read = engine._read

    def logged_read(path: Path, *args: object) -> object:
        read.append(path.name)
        return real_read(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_read", logged_read)
    assert run("pkg") == (cold, [])
    assert sorted(read) == ["estimates.py"]  # its finding is shown with its code


def test_a_change_that_keeps_size_and_mtime_is_still_seen(project: Path) -> None:
    # The status includes the ctime, which any write moves and no tool sets back.
    tools = project.parent / "tools"
    tools.mkdir()
    data = tools / "plot.py"
    data.write_text((project / "data.py").read_text())
    old = time.time() - 60
    os.utime(data, (old, old))
    run("pkg", "tools")
    text = data.read_text()
    data.write_text(text.replace("batch.sum()", "batch.max()"))  # same size
    os.utime(data, (old, old))
    assert run("pkg", "tools")[1] == ["plot.py"]


def test_a_read_only_cache_directory_is_not_an_error(project: Path) -> None:
    Path(CACHE_DIR_NAME).write_text("not a directory")
    cold, analysed = run("pkg")
    assert len(analysed) == 4 and "KL002" in cold


def test_entries_are_written_whole_or_not_at_all(project: Path, tmp_path: Path) -> None:
    settings = load_settings([project])
    cache = Cache(tmp_path / "cache", settings)
    result = engine.lint_paths([project], settings, cache=cache)
    assert list((tmp_path / "cache").rglob("index.json"))
    assert not list((tmp_path / "cache").rglob(".index-*"))  # no temporary left behind
    for entry in (tmp_path / "cache").rglob("*.json"):
        json.loads(entry.read_text())
    assert result.findings


def test_concurrent_runs_share_the_cache(project: Path) -> None:
    command = [sys.executable, "-m", "kllint", "--format", "concise", "--exit-zero", "pkg"]
    env = {k: v for k, v in os.environ.items() if k != "KLLINT_TEST_ANALYSED"}
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outputs = {r.communicate(timeout=120)[0] for r in runs}
    assert len(outputs) == 1
    assert run("pkg") == (outputs.pop(), [])


def test_a_fully_cached_run_never_imports_the_parser(project: Path) -> None:
    # LibCST takes longer to import than a cached run takes: it is imported
    # on first use, and a warm run with nothing to report has none.
    (project / "train.py").write_text("def step(batch):\n    return batch\n")
    (project / "rollout.py").unlink()
    script = textwrap.dedent(
        """\
        import sys
        from kllint.cli import main
        sys.argv = ["kllint", "--format", "concise", "--exit-zero", "pkg"]
        try:
            main()
        except SystemExit:
            pass
        print("parser imported:", "libcst._nodes" in sys.modules)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "KLLINT_TEST_ANALYSED"}

    def parser_imported() -> str:
        command = [sys.executable, "-c", script]
        output = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        return output.stdout.splitlines()[-1]

    assert parser_imported() == "parser imported: True"  # cold: estimates.py is analysed
    assert parser_imported() == "parser imported: False"
