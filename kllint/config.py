"""Settings: ``[tool.kllint]`` in the nearest ``pyproject.toml`` (or a
``kllint.toml``) of each file, then the command line.

```toml
[tool.kllint]
select = ["KL"]                      # codes, prefixes or names; default: every rule
extend-select = ["KL003"]            # added to the selection, whatever it is
ignore = ["token-level-kl-gradient"]
exclude = ["third_party", "scripts/*.py"]
extend-exclude = ["notebooks/scratch"]
respect-gitignore = true             # skip what .gitignore ignores (the default)

[tool.kllint.per-file-ignores]
"tests/*" = ["KL001"]

[tool.kllint.roles]                  # passed to RolePatterns.from_config
reference = ["^ref_model_logp$"]
```

Rule selection works like Ruff's: each layer (the config file, then the
command line) either replaces the selection (it has a ``select``) or edits
the one before it (``extend-select``, ``ignore``). Within a layer the more
specific selector wins, so ``select = ["KL002"]`` with ``ignore = ["KL"]``
keeps KL002.

Configuration is hierarchical, as in Ruff: each file takes the nearest
config file above it, so ``kllint a b`` and ``kllint b a`` agree when ``a/``
and ``b/`` have their own. ``kllint.toml`` holds the keys at its top level
(or under ``[tool.kllint]``) and wins over a ``pyproject.toml`` in the same
directory. ``--config FILE`` applies one file to every path. Options given on
the command line apply on top of whichever file a path takes.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kllint.analysis.roles import RolePatterns
from kllint.rules import RULES, lookup

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

KNOWN_KEYS = (
    "select",
    "extend-select",
    "ignore",
    "exclude",
    "extend-exclude",
    "per-file-ignores",
    "respect-gitignore",
    "roles",
)
# Looked for in each directory, in this order (as Ruff's ``ruff.toml`` before ``pyproject.toml``).
CONFIG_FILES = ("kllint.toml", "pyproject.toml")


class ConfigError(Exception):
    """A bad configuration value, from a file or from the command line."""


@dataclass(frozen=True)
class Overrides:
    """What the command line sets, applied on top of every config file."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    force_exclude: bool = False
    respect_gitignore: bool | None = None
    # One run's answers: directory -> its config file, config file -> settings.
    # Per run, not global, so that a config edited between runs is read again.
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


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
    respect_gitignore: bool = True
    # Apply ``exclude`` (and .gitignore) to files named on the command line
    # too, as pre-commit names every changed file.
    force_exclude: bool = False
    # Set when each file takes its nearest config file; ``None`` when one
    # configuration applies to every file (``--config``, or built in code).
    overrides: Overrides | None = None

    def for_path(self, path: Path) -> Settings:
        """The settings for ``path``: those of its nearest config file, with
        the command line's overrides on top."""
        if self.overrides is None:
            return self
        config = find_config(path, self.overrides.cache)
        if config == self.config_path:
            return self
        key = ("settings", config)
        if key not in self.overrides.cache:
            self.overrides.cache[key] = _settings_from(config, self.overrides)
        settings: Settings = self.overrides.cache[key]
        return settings

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
    extend_select: Sequence[str] = (),
    force_exclude: bool = False,
    respect_gitignore: bool | None = None,
) -> Settings:
    """The settings of the first path (its nearest config file, else the
    defaults), with the command line on top: ``select`` replaces the
    configured selection, ``extend_select`` adds to it, ``ignore`` removes
    from it. Without ``config``, ``Settings.for_path`` resolves every other
    file's own config file. Raises ``ConfigError``."""
    overrides = Overrides(
        select=tuple(select) if select is not None else None,
        extend_select=tuple(extend_select),
        ignore=tuple(ignore),
        force_exclude=force_exclude,
        respect_gitignore=respect_gitignore,
    )
    for selectors, origin in (
        (overrides.select or (), "--select"),
        (overrides.extend_select, "--extend-select"),
        (overrides.ignore, "--ignore"),
    ):
        resolve_codes(selectors, origin)  # fail on a typo before reading any file
    if config is not None:
        if not config.is_file():
            raise ConfigError(f"config file not found: {config}")
        return replace(_settings_from(config, overrides), overrides=None)
    start = Path(paths[0]) if paths else Path.cwd()
    return _settings_from(find_config(start), overrides)


def _settings_from(config: Path | None, overrides: Overrides) -> Settings:
    table = read_table(config) if config is not None else {}
    where = f"{config}: [tool.kllint]"

    def strings(key: str) -> list[str]:
        return _string_list(table.get(key, []), f"{where} {key}")

    config_select = strings("select") if "select" in table else None
    for key in ("select", "extend-select", "ignore"):
        resolve_codes(strings(key), f"{where} {key}")  # fail on a typo before choosing anything
    enabled = _apply_layer(
        frozenset(RULES), config_select, strings("ignore"), strings("extend-select")
    )
    enabled = _apply_layer(enabled, overrides.select, overrides.ignore, overrides.extend_select)

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

    respect_gitignore = table.get("respect-gitignore", True)
    if not isinstance(respect_gitignore, bool):
        raise ConfigError(f"{where} respect-gitignore: expected true or false")
    if overrides.respect_gitignore is not None:
        respect_gitignore = overrides.respect_gitignore

    return Settings(
        select=enabled,
        exclude=(*strings("exclude"), *strings("extend-exclude")),
        per_file_ignores=per_file_ignores,
        roles=roles,
        root=_absolute(config.parent if config is not None else Path.cwd()),
        config_path=config,
        respect_gitignore=respect_gitignore,
        force_exclude=overrides.force_exclude,
        overrides=overrides,
    )


def describe_settings(settings: Settings, path: Path) -> str:
    """``--show-settings``: what ``path`` is checked with, one ``key = value`` a line."""
    rules = ", ".join(sorted(settings.select)) or "(none)"
    lines = [
        f"path = {path}",
        f"config = {settings.config_path or '(none: the defaults)'}",
        f"root = {settings.root}",
        f"select = [{rules}]",
        f"exclude = {list(settings.exclude)}",
        "per-file-ignores = {"
        + ", ".join(f"{p!r}: {sorted(c)}" for p, c in settings.per_file_ignores)
        + "}",
        f"respect-gitignore = {str(settings.respect_gitignore).lower()}",
        f"force-exclude = {str(settings.force_exclude).lower()}",
        f"roles.policy = {list(settings.roles.policy)}",
        f"roles.reference = {list(settings.roles.reference)}",
        f"roles.old = {list(settings.roles.old)}",
    ]
    return "".join(f"{line}\n" for line in lines)


def find_config(start: Path, cache: dict[Any, Any] | None = None) -> Path | None:
    """The nearest config file at or above ``start``: a ``kllint.toml``, or a
    ``pyproject.toml`` with a ``[tool.kllint]`` table. Like Ruff, a
    ``pyproject.toml`` without one (a sub-package's, say) does not stop the
    search."""
    start = _absolute(start)
    first = start if start.is_dir() else start.parent
    cache = {} if cache is None else cache  # every file of a tree asks; siblings share answers
    visited = []
    found: Path | None = None
    directory = first
    while True:  # up from ``first``, building no more parents than the answer needs
        key = ("directory", directory)
        if key in cache:
            found = cache[key]
            break
        visited.append(key)
        found = _config_in(directory)
        if found is not None or directory.parent == directory:
            break
        directory = directory.parent
    for key in visited:
        cache[key] = found
    return found


def _config_in(directory: Path) -> Path | None:
    for name in CONFIG_FILES:
        candidate = directory / name
        if candidate.is_file() and (
            name != "pyproject.toml" or _kllint_table(_load_toml(candidate)) is not None
        ):
            return candidate
    return None


def read_table(path: Path) -> dict[str, Any]:
    """The ``[tool.kllint]`` table of ``path`` (or, in a ``kllint.toml``, the
    whole document), with its keys checked."""
    document = _load_toml(path)
    table = _kllint_table(document)
    if table is None:
        return document if path.name == "kllint.toml" else {}
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
    current: frozenset[str],
    select: Sequence[str] | None,
    ignore: Sequence[str],
    extend_select: Sequence[str] = (),
) -> frozenset[str]:
    enabled = set(current if select is None else ())
    moves = [(_specificity(s), True, s) for s in (*(select or ()), *extend_select)]
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
