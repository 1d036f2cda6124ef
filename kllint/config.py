"""Settings: ``[tool.kllint]`` in ``pyproject.toml``, then the command line.

```toml
[tool.kllint]
select = ["KL"]                      # codes, prefixes or names; default: every rule
ignore = ["token-level-kl-gradient"]
exclude = ["third_party", "scripts/*.py"]

[tool.kllint.per-file-ignores]
"tests/*" = ["KL001"]

[tool.kllint.roles]                  # passed to RolePatterns.from_config
reference = ["^ref_model_logp$"]
```

Rule selection works like Ruff's: each layer (the config file, then the
command line) either replaces the selection (it has a ``select``) or edits
the one before it (``ignore`` only). Within a layer the more specific
selector wins, so ``select = ["KL002"]`` with ``ignore = ["KL"]`` keeps KL002.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kllint.analysis.roles import RolePatterns
from kllint.rules import RULES, lookup

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

KNOWN_KEYS = ("select", "ignore", "exclude", "per-file-ignores", "roles")


class ConfigError(Exception):
    """A bad configuration value, from a file or from the command line."""


@dataclass(frozen=True)
class Settings:
    """Everything a run needs besides the paths."""

    select: frozenset[str] = frozenset(RULES)  # the enabled codes
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, frozenset[str]], ...] = ()
    roles: RolePatterns = field(default_factory=RolePatterns)
    # Globs are relative to this directory: the config file's, else the cwd.
    root: Path = field(default_factory=Path.cwd)
    config_path: Path | None = None

    def is_excluded(self, path: Path) -> bool:
        return any(_glob_matches(pattern, path, self.root) for pattern in self.exclude)

    def ignored_codes(self, path: Path) -> frozenset[str]:
        """Codes turned off for ``path`` by ``per-file-ignores``."""
        codes: set[str] = set()
        for pattern, ignored in self.per_file_ignores:
            if _glob_matches(pattern, path, self.root):
                codes |= ignored
        return frozenset(codes)


def load_settings(
    paths: Sequence[str | Path] = (),
    *,
    config: Path | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] = (),
) -> Settings:
    """Settings from ``config`` (or the nearest ``pyproject.toml`` with a
    ``[tool.kllint]`` table above the first path) overridden by the command
    line: ``select`` replaces the configured selection, ``ignore`` removes
    from it. Raises ``ConfigError``."""
    if config is None:
        start = Path(paths[0]) if paths else Path.cwd()
        config = find_config(start)
    elif not config.is_file():
        raise ConfigError(f"config file not found: {config}")
    table = read_table(config) if config is not None else {}
    where = f"{config}: [tool.kllint]"

    config_select = _string_list(table["select"], f"{where} select") if "select" in table else None
    config_ignore = _string_list(table.get("ignore", []), f"{where} ignore")
    for selectors, origin in (
        (config_select or [], f"{where} select"),
        (config_ignore, f"{where} ignore"),
        (select or [], "--select"),
        (ignore, "--ignore"),
    ):
        resolve_codes(selectors, origin)  # fail on a typo before choosing anything
    enabled = _apply_layer(frozenset(RULES), config_select, config_ignore)
    enabled = _apply_layer(enabled, select, ignore)

    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, Mapping):
        raise ConfigError(f"{where} per-file-ignores: must be a table of glob = [codes]")
    per_file_ignores = tuple(
        (pattern, resolve_codes(_string_list(codes, origin), origin))
        for pattern, codes in per_file.items()
        for origin in [f"{where} per-file-ignores {pattern!r}"]
    )

    roles_table = table.get("roles", {})
    if not isinstance(roles_table, Mapping):
        raise ConfigError(f"{where} roles: must be a table")
    try:
        roles = RolePatterns.from_config(roles_table)
    except ValueError as err:
        raise ConfigError(f"{where} roles: {err}") from None

    return Settings(
        select=enabled,
        exclude=tuple(_string_list(table.get("exclude", []), f"{where} exclude")),
        per_file_ignores=per_file_ignores,
        roles=roles,
        root=_absolute(config.parent if config is not None else Path.cwd()),
        config_path=config,
    )


def find_config(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has a
    ``[tool.kllint]`` table. Like Ruff, a ``pyproject.toml`` without one
    (a sub-package's, say) does not stop the search."""
    start = _absolute(start)
    if not start.is_dir():
        start = start.parent
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file() and _kllint_table(_load_toml(candidate)) is not None:
            return candidate
    return None


def read_table(path: Path) -> dict[str, Any]:
    """The ``[tool.kllint]`` table of ``path``, with its keys checked."""
    table = _kllint_table(_load_toml(path))
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.kllint] must be a table")
    for key in table:
        if key not in KNOWN_KEYS:
            raise ConfigError(
                f"{path}: [tool.kllint]: unknown key {key!r} (known: {', '.join(KNOWN_KEYS)})"
            )
    return table


def resolve_codes(selectors: Iterable[str], where: str = "") -> frozenset[str]:
    """The codes named by codes, code prefixes (``KL00``) or rule names."""
    codes: set[str] = set()
    for selector in selectors:
        matched = lookup(selector)
        if not matched:
            prefix = f"{where}: " if where else ""
            raise ConfigError(f"{prefix}unknown rule {selector!r} (see `kllint rules`)")
        codes.update(rule.code for rule in matched)
    return frozenset(codes)


def _apply_layer(
    current: frozenset[str], select: Sequence[str] | None, ignore: Sequence[str]
) -> frozenset[str]:
    enabled = set(current if select is None else ())
    moves = [(_specificity(s), True, s) for s in select or ()]
    moves += [(_specificity(s), False, s) for s in ignore]
    # Least specific first, so that ``KL002`` overrides ``KL`` whichever list it is in.
    for _, on, selector in sorted(moves, key=lambda move: move[0]):
        codes = resolve_codes([selector])
        enabled = enabled | codes if on else enabled - codes
    return frozenset(enabled)


def _specificity(selector: str) -> int:
    key = selector.strip().upper()
    return len(key) if key.startswith("KL") else len("KL000")  # a name names one rule


def _string_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    return value


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: not UTF-8 (at byte {err.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from None


def _kllint_table(document: dict[str, Any]) -> object | None:
    tool = document.get("tool")
    return tool.get("kllint") if isinstance(tool, dict) else None


def _glob_matches(pattern: str, path: Path, root: Path) -> bool:
    """Ruff-style globs: relative to ``root``, ``*`` also crosses ``/``, and a
    pattern without a slash may match any path component (``build``,
    ``__init__.py``). A pattern matches a file when it matches the file or
    any directory above it, so ``tests`` covers ``tests/unit/test_kl.py``."""
    pattern = pattern.rstrip("/")
    path = _absolute(path)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        parts = (path.name,)
    candidates = [path.as_posix(), *parts]
    candidates += ["/".join(parts[: i + 1]) for i in range(len(parts))]
    patterns = {pattern, pattern.replace("**/", "")}  # ``a/**/b`` also matches ``a/b``
    return any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns)


def _absolute(path: Path) -> Path:
    # Not ``resolve()``: a symlinked file is matched where it is linked, not where it points.
    return Path(os.path.abspath(path))
