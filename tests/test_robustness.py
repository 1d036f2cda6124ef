"""No input crashes, hangs or silences kllint: a file it cannot handle is
reported on its own (E998, "could not analyse") and every other file is
still linted. Inputs are generated here; none is stored in the repository."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kllint import engine, workers
from kllint.analysis.project import Project
from kllint.cli import main
from kllint.config import load_settings
from kllint.engine import lint_paths

K1_LOSS = textwrap.dedent(
    """\
    def train_step(policy_logp, ref_logp):
        kl = policy_logp - ref_logp
        loss = kl.mean()
        loss.backward()
    """
)


def codes(result: engine.LintResult) -> list[tuple[str, str]]:
    found = [(Path(f.path).name, f.code) for f in result.findings]
    return sorted(found + [(Path(e.path).name, e.code) for e in result.errors])


def lint(*paths: Path, **kwargs: object) -> engine.LintResult:
    return lint_paths(list(paths), load_settings(list(paths)), **kwargs)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


# ------------------------------------------------------------ isolation


def test_a_file_that_crashes_the_native_parser_is_reported_alone(tmp_path: Path) -> None:
    # 10,000 nested brackets overflow the stack of LibCST's native parser.
    (tmp_path / "deep.py").write_text("# kl loss\nx = " + "(" * 10000 + "1" + ")" * 10000 + "\n")
    (tmp_path / "train.py").write_text(K1_LOSS)
    result = lint(tmp_path)
    assert codes(result) == [("deep.py", "E998"), ("train.py", "KL001")]
    assert result.internal_errors == 0


def test_in_process_runs_refuse_deep_nesting_instead_of_crashing(tmp_path: Path) -> None:
    (tmp_path / "deep.py").write_text("# kl loss\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    result = lint(tmp_path / "deep.py", keep_sites=True)
    assert [e.message for e in result.errors] == [
        "could not analyse: brackets nested 5000 deep (more than 200)"
    ]


def _slow_on_marked_files(source: str, path: str, project: object, roles: object) -> list:
    if "SPIN" in source:  # computes forever: stopped after 1 s of CPU time
        while True:
            pass
    if "WAIT" in source:  # waits forever: stopped after 1 s without computing
        time.sleep(600)
    return engine_check_source(source, path, project, roles)


engine_check_source = engine.check_source


@pytest.mark.parametrize("kind", ["SPIN", "WAIT"])
def test_a_file_over_the_time_budget_is_reported_and_the_others_linted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(workers, "FILE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(engine, "check_source", _slow_on_marked_files)
    (tmp_path / "slow.py").write_text(f"# {kind} the kl term\n")
    (tmp_path / "train.py").write_text(K1_LOSS)
    start = time.monotonic()
    result = lint(tmp_path)
    assert time.monotonic() - start < 30
    assert codes(result) == [("slow.py", "E998"), ("train.py", "KL001")]
    assert "took longer than 1 s" in result.errors[0].message


def _greedy_on_marked_files(source: str, path: str, project: object, roles: object) -> list:
    if "GREEDY" in source:
        hoard = [bytearray(1 << 20) for _ in range(4096)]  # 4 GiB
        del hoard
    return engine_check_source(source, path, project, roles)


def test_a_file_over_the_memory_budget_is_reported_and_the_others_linted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "MEMORY_BUDGET_BYTES", 256 << 20)
    monkeypatch.setattr(engine, "check_source", _greedy_on_marked_files)
    (tmp_path / "greedy.py").write_text("# GREEDY kl term\n")
    (tmp_path / "train.py").write_text(K1_LOSS)
    result = lint(tmp_path)
    assert codes(result) == [("greedy.py", "E998"), ("train.py", "KL001")]
    assert "memory" in result.errors[0].message


def test_a_file_over_the_size_cap_is_reported_not_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "MAX_FILE_BYTES", 1000)
    (tmp_path / "huge.py").write_text("x = 1\n" * 1000)
    (tmp_path / "train.py").write_text(K1_LOSS)
    result = lint(tmp_path)
    assert codes(result) == [("huge.py", "E998"), ("train.py", "KL001")]
    assert "file too large" in result.errors[0].message


def test_workers_never_outnumber_the_usable_cpus() -> None:
    assert engine.worker_count(1 << 40, 64) <= workers.usable_cpus()
    assert engine.worker_count(5_000, 8) == 1  # a small tree stays in one worker


# ------------------------------------------------------------ valid code the analysis finds hard


def test_self_referential_updates_are_linear_not_exponential(tmp_path: Path) -> None:
    doubling = "".join("    kl = kl + kl\n" for _ in range(40))
    (tmp_path / "train.py").write_text(
        "def f(policy_logp, ref_logp):\n    kl = policy_logp - ref_logp\n"
        + doubling
        + "    kl.sum().backward()\n"
    )
    start = time.monotonic()
    result = lint(tmp_path, keep_sites=True)
    assert time.monotonic() - start < 10
    assert codes(result) == [("train.py", "KL001")]


def test_a_400_term_sum_is_analysed(tmp_path: Path) -> None:
    total = " + ".join(["kl"] * 400)
    (tmp_path / "train.py").write_text(
        f"def f(policy_logp, ref_logp):\n    kl = policy_logp - ref_logp\n"
        f"    loss = {total}\n    loss.mean().backward()\n"
    )
    assert codes(lint(tmp_path)) == [("train.py", "KL001")]


def test_huge_numbers_are_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "def f(policy_logp, ref_logp):\n"
        f"    kl = (policy_logp - ref_logp) * 1{'0' * 320}\n"
        "    penalty = (policy_logp - ref_logp) * 1e200 * 1e200\n"
        "    (kl + penalty).sum().backward()\n"
    )
    # Scales beyond a float are coefficients: they do not change the gradient's direction.
    assert codes(lint(tmp_path, keep_sites=True)) == [("train.py", "KL001")]


# ------------------------------------------------------------ syntax verdicts


def test_newer_syntax_than_this_python_is_not_a_syntax_error(tmp_path: Path) -> None:
    # Both hold a KL word, so both are parsed, by LibCST, whatever Python runs kllint.
    (tmp_path / "report.py").write_text('d = {"kl": 1}\nx = f"{d["kl"]}"\n')  # PEP 701 (3.12)
    (tmp_path / "broken.py").write_text("def kl(:\n")
    assert codes(lint(tmp_path)) == [("broken.py", "E999")]


def test_a_file_that_cannot_hold_a_kl_term_is_not_parsed(tmp_path: Path) -> None:
    # kllint reads only files that can hold a KL term: a syntax error
    # elsewhere is for the other linters to report.
    (tmp_path / "setup_utils.py").write_text("def f(:\n")
    (tmp_path / "train.py").write_text(K1_LOSS)
    assert codes(lint(tmp_path)) == [("train.py", "KL001")]


def test_code_this_python_accepts_but_libcst_cannot_parse_is_not_a_syntax_error(
    tmp_path: Path,
) -> None:
    # Valid Python that LibCST rejects: a form feed inside indentation, and
    # 5,000 implicitly concatenated strings.
    (tmp_path / "feed.py").write_text("# kl loss\nif True:\n    x = 1\n\x0c    y = 2\n")
    (tmp_path / "strings.py").write_text("# kl loss\nx = (" + " ".join(['"a"'] * 5000) + ")\n")
    result = lint(tmp_path)
    assert all(e.code != "E999" for e in result.errors), result.errors
    assert result.internal_errors == 0


# ------------------------------------------------------------ discovery


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_like_python_or_yaml_does_not_hang(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    os.mkfifo(package / "x.py")
    os.mkfifo(package / "config.yaml")  # the config-defaults scan reads YAML
    (package / "train.py").write_text(K1_LOSS.replace("kl.mean()", "kl.mean() * coef"))
    assert codes(lint(package)) == [("train.py", "KL001")]
    named = lint(package / "x.py")
    assert [e.message for e in named.errors] == ["cannot read file: not a regular file"]


def test_an_unreadable_directory_is_reported_and_the_rest_linted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "locked").mkdir()
    (tmp_path / "train.py").write_text(K1_LOSS)
    real_scandir = os.scandir

    def scandir(path: object = ".") -> object:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    result = lint(tmp_path)
    assert codes(result) == [("locked", "E999"), ("train.py", "KL001")]
    assert result.errors[0].message == "cannot read directory: Permission denied"


def test_a_symlink_loop_is_named_as_such(tmp_path: Path) -> None:
    os.symlink("loop", tmp_path / "loop")
    with pytest.raises(engine.MissingPathError, match="symbolic link loop: loop"):
        lint(Path("loop"))


def test_calling_an_imported_module_from_the_current_directory(tmp_path: Path) -> None:
    # `kllint` with no path lints "."; resolving `import tqdm` there used to
    # fail on Path(".").with_suffix.
    looped = K1_LOSS.replace("    kl =", "    for _ in tqdm(range(3)):\n        pass\n    kl =")
    (tmp_path / "train.py").write_text("import tqdm\n\n\n" + looped)
    result = lint_paths([], load_settings([]))
    assert codes(result) == [("train.py", "KL001")]


def test_findings_do_not_depend_on_which_paths_are_named(tmp_path: Path) -> None:
    # Two folders (no __init__.py) define `estimates`; train.py imports one
    # it does not have. Which it got used to depend on the paths named first.
    for folder, estimate in (
        ("a", "policy_logp - ref_logp"),
        ("b", "(policy_logp - ref_logp) ** 2"),
    ):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "estimates.py").write_text(
            f"def divergence(policy_logp, ref_logp):\n    return {estimate}\n"
        )
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "train.py").write_text(
        "from estimates import divergence\n\n\n"
        "def step(policy_logp, ref_logp):\n"
        "    loss = divergence(policy_logp, ref_logp).mean()\n"
        "    loss.backward()\n"
    )

    def train_findings(*paths: str) -> list[tuple[int, str]]:
        result = lint(*(Path(p) for p in paths))
        return [(f.line, f.code) for f in result.findings if f.path == "c/train.py"]

    assert train_findings("a", "c") == train_findings("b", "c") == train_findings("c")


# ------------------------------------------------------------ the config-defaults scan


def test_a_large_yaml_file_is_scanned_in_linear_time(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.yaml").write_text("".join(f"key_{i}: {i}\n" for i in range(200_000)))
    start = time.monotonic()
    defaults = Project([tmp_path]).config_defaults(package / "__init__.py", "key_199999")
    assert time.monotonic() - start < 10
    assert [(d.value, d.source) for d in defaults] == [(199999, "pkg/config.yaml:200000")]


# ------------------------------------------------------------ output and configuration


def test_a_broken_pyproject_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(K1_LOSS)
    for text in (b'[tool.kllint]\nselect = ["\xff"]\n', b"x = " + b"[" * 100_000 + b"\n"):
        (tmp_path / "pyproject.toml").write_bytes(text)
        result = CliRunner().invoke(main, ["--no-cache", "train.py"])
        assert result.exit_code == 2
        assert result.output.startswith("kllint: error: ") and result.output.count("\n") == 1


def test_sarif_names_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    name = os.fsdecode(b"caf\xe9 loss.py")
    (tmp_path / name).write_text(K1_LOSS)
    result = CliRunner().invoke(main, ["--no-cache", "--format", "sarif", "."])
    assert result.exit_code == 1, result.output
    log = json.loads(result.output)
    [location] = log["runs"][0]["results"][0]["locations"]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == "caf%E9%20loss.py"


def test_control_characters_in_file_names_are_escaped(tmp_path: Path) -> None:
    (tmp_path / "\x1b[31mred.py").write_text(K1_LOSS)
    result = CliRunner().invoke(main, ["--no-cache", "--format", "concise", "."])
    assert "\\x1b[31mred.py:2:10: KL001" in result.output


def test_a_report_that_cannot_be_written_is_a_one_line_error(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    (tmp_path / "train.py").write_text(K1_LOSS)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "kllint", "--no-cache", "--exit-zero", "train.py"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 2
    assert done.stderr == "kllint: error: cannot write the report: No space left on device\n"


# ------------------------------------------------------------ signals

_SLOW_RUN = textwrap.dedent(
    """\
    import os, signal, sys, time
    from kllint import engine
    from kllint.cli import main

    # Ctrl-C as a terminal delivers it, even when the test run itself was
    # started in the background (which makes its children ignore SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def slow(source, path, project, roles):
        with open(os.environ["PIDS"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(600)

    engine.check_source = slow
    sys.argv = ["kllint", "--no-cache", "--jobs", "2", "."]
    main()
    """
)


def _start_slow_run(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    for i in range(60):
        (tmp_path / f"m{i}.py").write_text("kl = 1\n")
    pids = tmp_path / "pids.txt"
    process = subprocess.Popen(
        [sys.executable, "-c", _SLOW_RUN],
        cwd=tmp_path,
        env={**os.environ, "PIDS": str(pids)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text().strip()):
        assert time.monotonic() < deadline and process.poll() is None, "no worker started"
        time.sleep(0.1)
    return process, pids


def _all_gone(pids: Path, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    alive = [int(p) for p in pids.read_text().split()]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and _not_zombie(p)]
        time.sleep(0.1)
    return not alive


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")


@linux_only
def test_ctrl_c_stops_at_once_with_130_and_no_traceback(tmp_path: Path) -> None:
    process, pids = _start_slow_run(tmp_path)
    start = time.monotonic()
    process.send_signal(signal.SIGINT)  # to the parent alone
    _, stderr = process.communicate(timeout=20)
    assert time.monotonic() - start < 10
    assert process.returncode == 130
    assert "Traceback" not in stderr
    assert _all_gone(pids)


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_the_parent_leaves_no_worker_behind(tmp_path: Path, sig: signal.Signals) -> None:
    process, pids = _start_slow_run(tmp_path)
    process.send_signal(sig)
    process.communicate(timeout=20)
    assert _all_gone(pids)


# ------------------------------------------------------------ smaller ones


def test_an_unterminated_ignore_silences_nothing() -> None:
    from kllint.suppression import parse_suppressions

    assert parse_suppressions("x = 1  # kllint: ignore[KL002\n") == {}
    assert parse_suppressions("x = 1  # kllint: ignore[KL002]\n") == {1: frozenset({"KL002"})}
    assert parse_suppressions("x = 1  # kllint: ignore\n") == {1: None}


def test_the_unnamed_estimate_is_not_an_estimate_estimate() -> None:
    from types import SimpleNamespace

    from kllint.rules.base import estimate

    def site(estimator: str) -> SimpleNamespace:
        return SimpleNamespace(
            estimator=estimator, estimate_names=["logp"], policy_names=[], reference_names=["ref"]
        )

    assert estimate(site("KL estimate")) == "KL estimate `logp`/`ref`"  # type: ignore[arg-type]
    assert estimate(site("k3")) == "k3 estimate `logp`/`ref`"  # type: ignore[arg-type]


@pytest.mark.parametrize("separator", ["\u2028", "\x85", "\x0c", "\x1c"])
def test_the_snippet_is_the_flagged_line_after_unusual_line_separators(
    tmp_path: Path, separator: str
) -> None:
    (tmp_path / "train.py").write_text(f'NOTE = "a{separator}b"\n' + K1_LOSS)
    result = CliRunner().invoke(main, ["--no-cache", "train.py"])
    assert "3 |     kl = policy_logp - ref_logp\n" in result.output, result.output


def test_python_parser_warnings_do_not_reach_stderr(tmp_path: Path) -> None:
    (tmp_path / "odd.py").write_text("x = 1()\ny = 'a' is 'a'\n")
    done = subprocess.run(
        [sys.executable, "-m", "kllint", "--no-cache", "odd.py"], capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (0, "")
