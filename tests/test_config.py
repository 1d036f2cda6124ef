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
    pyproject('extend-select = ["KL002"]')
    with pytest.raises(ConfigError, match=r"pyproject\.toml.*unknown key 'extend-select'"):
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
