"""``[tool.kllint]`` in pyproject.toml, and how the command line overrides it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_analysis import flag_markers

from kllint.config import ConfigError, find_config, load_settings
from kllint.engine import lint_paths
from kllint.rules import RULES

ALL = set(RULES)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("kllint.engine.check_source", flag_markers)


def write(path: str, text: str) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    return Path(path)


def pyproject(body: str) -> Path:
    return write("pyproject.toml", f"[tool.kllint]\n{body}\n")


def test_without_config_every_rule_is_on() -> None:
    settings = load_settings(["."])
    assert settings.select == ALL
    assert settings.config_path is None


def test_nearest_pyproject_with_a_kllint_table_wins() -> None:
    pyproject('select = ["KL002"]')
    write("pkg/pyproject.toml", "[project]\nname = 'pkg'\n")  # no [tool.kllint]: skipped
    write("pkg/sub/train.py", "")
    assert find_config(Path("pkg/sub/train.py")) == Path("pyproject.toml").absolute()
    assert load_settings(["pkg/sub/train.py"]).select == {"KL002"}


@pytest.mark.parametrize(
    ("body", "enabled"),
    [
        ('select = ["KL002"]', {"KL002"}),
        ('select = ["differentiated-k3-estimate", "KL005"]', {"KL002", "KL005"}),
        ('select = ["KL00"]', ALL),
        ('ignore = ["KL001", "k3-estimate-as-reward"]', ALL - {"KL001", "KL004"}),
        # The more specific selector wins, whichever list it is in.
        ('select = ["KL002"]\nignore = ["KL"]', {"KL002"}),
        ('select = ["KL"]\nignore = ["KL002"]', ALL - {"KL002"}),
    ],
)
def test_select_and_ignore_in_config(body: str, enabled: set[str]) -> None:
    pyproject(body)
    assert load_settings(["."]).select == enabled


def test_command_line_select_replaces_and_ignore_removes() -> None:
    pyproject('select = ["KL001", "KL002"]\nignore = ["KL001"]')
    assert load_settings(["."], select=["KL005"]).select == {"KL005"}
    assert load_settings(["."], ignore=["KL002"]).select == set()
    assert load_settings(["."], select=["KL"], ignore=["KL003"]).select == ALL - {"KL003"}


def test_unknown_key_names_the_file_and_the_key() -> None:
    pyproject('extend-selct = ["KL002"]')
    with pytest.raises(ConfigError, match=r"pyproject\.toml.*unknown key 'extend-selct'"):
        load_settings(["."])


def test_unknown_rule_names_the_key() -> None:
    pyproject('ignore = ["KL999"]')
    with pytest.raises(ConfigError, match=r"\[tool\.kllint\] ignore: unknown rule 'KL999'"):
        load_settings(["."])


def test_unknown_rule_on_the_command_line() -> None:
    with pytest.raises(ConfigError, match=r"--select: unknown rule 'k4'"):
        load_settings(["."], select=["k4"])


@pytest.mark.parametrize(
    "body",
    [
        'select = "KL002"',  # not a list
        "exclude = [1]",
        'per-file-ignores = ["tests/*"]',
        'roles = "policy"',
        "select = [",  # not TOML
    ],
)
def test_malformed_values_are_config_errors(body: str) -> None:
    pyproject(body)
    with pytest.raises(ConfigError, match=r"pyproject\.toml"):
        load_settings(["."])


def test_bad_roles_table_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def reject(mapping: object) -> None:
        raise ValueError("unknown role 'critic'")

    monkeypatch.setattr("kllint.config.RolePatterns.from_config", reject)
    pyproject('[tool.kllint.roles]\ncritic = ["^v$"]')
    with pytest.raises(ConfigError, match=r"roles: unknown role 'critic'"):
        load_settings(["."])


def test_explicit_config_file(tmp_path: Path) -> None:
    write("ci/kllint.toml", '[tool.kllint]\nselect = ["KL005"]\n')
    assert load_settings(["."], config=Path("ci/kllint.toml")).select == {"KL005"}
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(["."], config=Path("missing.toml"))


def test_per_file_ignores() -> None:
    pyproject(
        "[tool.kllint.per-file-ignores]\n"
        '"tests/*" = ["KL002"]\n'
        '"__init__.py" = ["differentiated-k3-estimate"]\n'
        '"scripts/**/legacy_*.py" = ["KL"]\n'
    )
    for name in [
        "train.py",
        "tests/test_kl.py",
        "tests/unit/test_kl.py",
        "pkg/__init__.py",
        "scripts/legacy_ppo.py",
        "scripts/old/legacy_grpo.py",
    ]:
        write(name, "kl = low_var_kl(logp, ref_logp)\n")
    result = lint_paths(["."], load_settings(["."]))
    assert [f.path for f in result.findings] == ["train.py"]


def test_exclude_skips_discovered_files_but_not_named_ones() -> None:
    pyproject('exclude = ["generated", "*_pb2.py"]')
    for name in ["train.py", "generated/losses.py", "proto/kl_pb2.py"]:
        write(name, "kl = low_var_kl(logp, ref_logp)\n")
    settings = load_settings(["."])
    assert [f.path for f in lint_paths(["."], settings).findings] == ["train.py"]
    named = lint_paths(["generated/losses.py"], settings)
    assert [f.path for f in named.findings] == ["generated/losses.py"]


def test_discovery_skips_hidden_cache_and_virtualenv_directories() -> None:
    for name in [
        "train.py",
        ".hidden/train.py",
        "__pycache__/train.py",
        ".venv/lib/train.py",
        "venv/lib/train.py",
        "env/lib/train.py",  # a virtualenv by its pyvenv.cfg, whatever its name
        "build/lib/train.py",
        "notes.txt",
    ]:
        write(name, "kl = low_var_kl(logp, ref_logp)\n")
    write("env/pyvenv.cfg", "home = /usr/bin\n")
    result = lint_paths(["."])
    assert [f.path for f in result.findings] == ["train.py"]
    assert result.files_checked == 1


def test_named_file_is_linted_whatever_its_suffix() -> None:
    write("bin/train", "kl = low_var_kl(logp, ref_logp)\n")
    assert [f.path for f in lint_paths(["bin/train"]).findings] == ["bin/train"]


K3 = "kl = low_var_kl(logp, ref_logp)\n"


def test_each_file_takes_its_nearest_config_whatever_the_order_of_paths() -> None:
    write("a/pyproject.toml", '[tool.kllint]\nignore = ["KL002"]\n')
    write("b/pyproject.toml", '[tool.kllint]\nexclude = ["generated"]\n')
    for name in ["a/train.py", "b/train.py", "b/generated/losses.py"]:
        write(name, K3)
    for order in (["a", "b"], ["b", "a"]):
        result = lint_paths(order, load_settings(order))
        assert [f.path for f in result.findings] == ["b/train.py"], order


def test_command_line_applies_on_top_of_every_config() -> None:
    write("a/pyproject.toml", '[tool.kllint]\nselect = ["KL001"]\n')
    write("a/train.py", K3)
    write("b/train.py", K3)
    settings = load_settings(["a", "b"], extend_select=["KL002"])
    assert [f.path for f in lint_paths(["a", "b"], settings).findings] == [
        "a/train.py",
        "b/train.py",
    ]
    settings = load_settings(["a", "b"], ignore=["KL002"])
    assert lint_paths(["a", "b"], settings).findings == []


def test_explicit_config_applies_to_every_path() -> None:
    write("a/pyproject.toml", '[tool.kllint]\nselect = ["KL001"]\n')
    write("ci.toml", "[tool.kllint]\n")
    write("a/train.py", K3)
    settings = load_settings(["a"], config=Path("ci.toml"))
    assert [f.path for f in lint_paths(["a"], settings).findings] == ["a/train.py"]


def test_kllint_toml_holds_the_keys_at_top_level_and_wins_over_pyproject() -> None:
    pyproject('select = ["KL002"]')
    write("kllint.toml", 'select = ["KL001"]\n')
    settings = load_settings(["."])
    assert settings.config_path == Path("kllint.toml").absolute()
    assert settings.select == {"KL001"}


def test_extend_select_and_extend_exclude() -> None:
    pyproject(
        'select = ["KL001"]\nextend-select = ["KL002"]\nexclude = ["a"]\nextend-exclude = ["b"]'
    )
    for name in ["train.py", "a/x.py", "b/x.py"]:
        write(name, K3)
    settings = load_settings(["."])
    assert settings.select == {"KL001", "KL002"}
    assert [f.path for f in lint_paths(["."], settings).findings] == ["train.py"]


def test_gitignore_is_respected_inside_a_git_work_tree() -> None:
    Path(".git").mkdir()
    write(".gitignore", "outputs/\n*_generated.py\n!keep_generated.py\n")
    write("sub/.gitignore", "scratch.py\n")
    names = ["train.py", "outputs/train.py", "x_generated.py", "keep_generated.py"]
    for name in [*names, "sub/scratch.py", "sub/train.py"]:
        write(name, K3)
    found = [f.path for f in lint_paths(["."], load_settings(["."])).findings]
    assert found == ["keep_generated.py", "sub/train.py", "train.py"]
    pyproject("respect-gitignore = false")
    assert len(lint_paths(["."], load_settings(["."])).findings) == 6
    # A file named on the command line is linted (unless --force-exclude).
    assert len(lint_paths(["outputs/train.py"], load_settings(["."])).findings) == 1


def test_force_exclude_applies_exclude_to_named_files() -> None:
    pyproject('exclude = ["generated"]')
    write("generated/losses.py", K3)
    write("train.py", K3)
    named = ["generated/losses.py", "train.py"]
    assert len(lint_paths(named, load_settings(named)).findings) == 2
    forced = load_settings(named, force_exclude=True)
    assert [f.path for f in lint_paths(named, forced).findings] == ["train.py"]


def test_a_config_edited_between_runs_is_read_again() -> None:
    pyproject('select = ["KL001"]')
    assert load_settings(["."]).select == {"KL001"}
    pyproject('select = ["KL002"]')
    assert load_settings(["."]).select == {"KL002"}
